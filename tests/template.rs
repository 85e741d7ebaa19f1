//! The SAM template's invariants, which cfn-lint does not check: a bad edit fails CI here.
//! (cfn-lint misses a misspelled `ReportBatchItemFailures`, `BatchSize: 0`, a bogus runtime.)

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// The template as JSON, with short-form intrinsics (`!Ref x`) in long form (`{"Ref": x}`).
fn template() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../infra/template.yaml");
    let text = std::fs::read_to_string(path).expect("infra/template.yaml");
    to_json(serde_yaml_ng::from_str(&text).expect("valid YAML"))
}

fn to_json(v: serde_yaml_ng::Value) -> Value {
    use serde_yaml_ng::Value as Y;
    match v {
        Y::Null => Value::Null,
        Y::Bool(b) => json!(b),
        Y::Number(n) => serde_json::to_value(n).unwrap_or(Value::Null),
        Y::String(s) => json!(s),
        Y::Sequence(s) => Value::Array(s.into_iter().map(to_json).collect()),
        Y::Mapping(m) => Value::Object(
            m.into_iter().map(|(k, v)| (k.as_str().expect("string keys").to_owned(), to_json(v))).collect(),
        ),
        Y::Tagged(t) => {
            let tag = t.tag.to_string().trim_start_matches('!').to_owned();
            let key = if tag == "Ref" { tag } else { format!("Fn::{tag}") };
            json!({ key: to_json(t.value) })
        }
    }
}

fn num(v: &Value) -> i64 {
    v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The logical id a `!GetAtt X.Arn` / `!Ref X` names.
fn target(v: &Value) -> String {
    if let Some(r) = v.get("Ref") {
        return r.as_str().unwrap().to_owned();
    }
    let att = v.get("Fn::GetAtt").unwrap_or_else(|| panic!("not a reference: {v}"));
    att.as_str().map(|s| s.split('.').next().unwrap().to_owned()).unwrap_or_else(|| att[0].as_str().unwrap().to_owned())
}

fn functions(t: &Value) -> BTreeMap<String, Value> {
    t["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, r)| r["Type"] == "AWS::Serverless::Function")
        .map(|(name, r)| (name.clone(), r.clone()))
        .collect()
}

/// Every action a role allows (its inline policies and any `AWS::IAM::Policy` attached to
/// it), by resource target. A conditional statement counts as if its condition held.
fn role_actions(t: &Value, role: &str) -> BTreeSet<String> {
    let r = &t["Resources"][role]["Properties"];
    let attached = t["Resources"].as_object().unwrap().values().filter(|p| {
        p["Type"] == "AWS::IAM::Policy" && p["Properties"]["Roles"].as_array().unwrap().iter().any(|x| target(x) == role)
    });
    let documents: Vec<&Value> = r["Policies"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(attached.map(|p| &p["Properties"]))
        .map(|p| &p["PolicyDocument"])
        .collect();
    let mut actions = BTreeSet::new();
    for doc in documents {
        for s in doc["Statement"].as_array().unwrap() {
            let s = s.get("Fn::If").map_or(s, |branches| &branches[1]);
            assert_eq!(s["Effect"], "Allow");
            let resources = s["Resource"].as_array().cloned().unwrap_or_else(|| vec![s["Resource"].clone()]);
            for a in s["Action"].as_array().cloned().unwrap_or_else(|| vec![s["Action"].clone()]) {
                for res in &resources {
                    actions.insert(format!("{} {}", a.as_str().unwrap(), target(res)));
                }
            }
        }
    }
    actions
}

/// The template's task roles: IAM roles whose logical id ends in `TaskRole`.
fn task_roles(t: &Value) -> BTreeMap<String, Value> {
    t["Resources"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(name, r)| name.ends_with("TaskRole") && r["Type"] == "AWS::IAM::Role")
        .map(|(name, r)| (name.clone(), r.clone()))
        .collect()
}

#[test]
fn five_arm64_cargo_lambda_functions_one_per_workspace_crate() {
    let t = template();
    let g = &t["Globals"]["Function"];
    assert_eq!(g["Runtime"], "provided.al2023");
    assert_eq!(g["Architectures"], json!(["arm64"]));
    assert_eq!(g["Handler"], "bootstrap");
    let fns = functions(&t);
    let binaries: BTreeSet<String> = fns
        .values()
        .map(|f| {
            assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda");
            assert_eq!(f["Properties"]["CodeUri"], "..", "the workspace root");
            assert!(f["Properties"].get("Runtime").is_none(), "runtime comes from Globals");
            f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap().to_owned()
        })
        .collect();
    let members: BTreeSet<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../functions"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(binaries, members);
    assert_eq!(binaries.len(), 5);
    let workspace = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../Cargo.toml")).unwrap();
    for m in &members {
        assert!(workspace.contains(&format!("\"functions/{m}\"")), "functions/{m} is a workspace member");
    }
}

#[test]
fn queues_redrive_and_outlast_their_consumers() {
    let t = template();
    let res = &t["Resources"];
    let mut sqs_events = 0;
    for (name, f) in functions(&t) {
        let p = &f["Properties"];
        for (_, ev) in p["Events"].as_object().into_iter().flatten() {
            if ev["Type"] != "SQS" {
                continue;
            }
            sqs_events += 1;
            let e = &ev["Properties"];
            assert_eq!(e["FunctionResponseTypes"], json!(["ReportBatchItemFailures"]), "{name}: partial batch responses");
            assert!((1..=10).contains(&num(&e["BatchSize"])), "{name}: BatchSize 1..=10");
            let max_conc = num(&e["ScalingConfig"]["MaximumConcurrency"]);
            assert!(max_conc >= 2, "{name}: SQS MaximumConcurrency is at least 2");
            assert!(max_conc <= num(&p["ReservedConcurrentExecutions"]), "{name}: MaximumConcurrency within reserved concurrency");
            let queue = &res[target(&e["Queue"])]["Properties"];
            assert!(
                num(&queue["VisibilityTimeout"]) >= 6 * num(&p["Timeout"]),
                "{name}: visibility timeout at least 6 x the function timeout"
            );
            let redrive = &queue["RedrivePolicy"];
            assert!(num(&redrive["maxReceiveCount"]) >= 5, "{name}: maxReceiveCount >= 5");
            let dlq = target(&redrive["deadLetterTargetArn"]);
            assert_eq!(res[&dlq]["Type"], "AWS::SQS::Queue", "{name}: a dead-letter queue");
            assert!(num(&res[&dlq]["Properties"]["MessageRetentionPeriod"]) >= 1_209_600, "{dlq} keeps messages 14 days");
        }
    }
    assert_eq!(sqs_events, 2, "executor and ingress consume SQS");
}

#[test]
fn the_executor_lease_outlasts_the_executor_timeout() {
    let t = template();
    let p = &t["Resources"]["ExecutorFunction"]["Properties"];
    let lease = num(&p["Environment"]["Variables"]["RELAY_LEASE_SECONDS"]);
    assert!(lease > num(&p["Timeout"]), "lease {lease} must exceed the function timeout");
    // Every function that reads RELAY_LEASE_SECONDS gets a valid value.
    let cfg = taskdeck::config::LambdaConfig::from_lookup(|k| (k == "RELAY_LEASE_SECONDS").then(|| lease.to_string()));
    assert_eq!(cfg.unwrap().lease.as_secs(), u64::try_from(lease).unwrap());
}

#[test]
fn the_sweeper_runs_every_minute_and_its_passes_fit_its_timeout() {
    let t = template();
    let p = &t["Resources"]["SweeperFunction"]["Properties"];
    let ev = p["Events"].as_object().unwrap().values().next().unwrap();
    assert!(ev["Type"] == "ScheduleV2" || ev["Type"] == "Schedule");
    assert_eq!(ev["Properties"]["ScheduleExpression"], "rate(1 minute)");
    let v = &p["Environment"]["Variables"];
    let busy = (num(&v["RELAY_SWEEP_PASSES"]) - 1) * num(&v["RELAY_SWEEP_GAP_SECONDS"]);
    assert!(num(&p["Timeout"]) >= busy + 60, "passes, gaps and a minute of work fit the timeout");
    assert_eq!(num(&p["ReservedConcurrentExecutions"]), 1);
}

#[test]
fn database_connections_are_bounded_and_stated() {
    let t = template();
    let mut budget = 0;
    for (name, f) in functions(&t) {
        let p = &f["Properties"];
        let uses_db = p["Environment"]["Variables"].get("DATABASE_URL").is_some();
        if uses_db {
            budget += num(&p["ReservedConcurrentExecutions"]);
            assert!(p.get("VpcConfig").is_some(), "{name} reaches RDS Proxy from the VPC");
        }
    }
    let stated = t["Outputs"]["DatabaseConnectionBudget"]["Value"].as_str().unwrap();
    assert!(stated.starts_with(&format!("{budget} = ")), "stated {stated:?}, computed {budget}");
    let console = &t["Resources"]["ConsoleFunction"]["Properties"];
    assert!(console.get("VpcConfig").is_none(), "the console stands alone: no VPC, no database");
    let env: Vec<&String> = console["Environment"]["Variables"].as_object().map(|m| m.keys().collect()).unwrap_or_default();
    assert_eq!(env, ["RELAY_CONSOLE_PROJECTS"], "the console gets its projects and nothing else");
}

#[test]
fn each_function_has_its_own_least_privilege_role() {
    let t = template();
    let set = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<String>>();
    let expected = [
        ("IntakeFunction", "IntakeRole", set(&["logs:CreateLogStream IntakeLogGroup", "logs:PutLogEvents IntakeLogGroup", "sqs:SendMessage WorkQueue"])),
        (
            "ExecutorFunction",
            "ExecutorRole",
            set(&[
                "logs:CreateLogStream ExecutorLogGroup",
                "logs:PutLogEvents ExecutorLogGroup",
                "sqs:ReceiveMessage WorkQueue",
                "sqs:DeleteMessage WorkQueue",
                "sqs:GetQueueAttributes WorkQueue",
                "sqs:SendMessage WorkQueue",
                "sts:AssumeRole EmailSendTaskRole",
                "sts:TagSession EmailSendTaskRole",
                "sts:AssumeRole TenantTaskRoleArns",
                "sts:TagSession TenantTaskRoleArns",
            ]),
        ),
        ("SweeperFunction", "SweeperRole", set(&["logs:CreateLogStream SweeperLogGroup", "logs:PutLogEvents SweeperLogGroup", "sqs:SendMessage WorkQueue"])),
        (
            "IngressFunction",
            "IngressRole",
            set(&[
                "logs:CreateLogStream IngressLogGroup",
                "logs:PutLogEvents IngressLogGroup",
                "sqs:ReceiveMessage IngressQueue",
                "sqs:DeleteMessage IngressQueue",
                "sqs:GetQueueAttributes IngressQueue",
                "sqs:SendMessage WorkQueue",
            ]),
        ),
        ("ConsoleFunction", "ConsoleRole", set(&["logs:CreateLogStream ConsoleLogGroup", "logs:PutLogEvents ConsoleLogGroup"])),
    ];
    for (function, role, actions) in expected {
        let p = &t["Resources"][function]["Properties"];
        assert_eq!(target(&p["Role"]), role, "{function} has its own role");
        assert!(p.get("Policies").is_none(), "{function}: no SAM policy templates (they grant on *)");
        assert_eq!(role_actions(&t, role), actions, "{role}");
    }
    assert!(t["Resources"]["ConsoleRole"]["Properties"].get("ManagedPolicyArns").is_none());
}

#[test]
fn each_task_type_has_its_own_role_trusting_only_the_executor() {
    let t = template();
    let roles = task_roles(&t);
    assert!(!roles.is_empty());
    // Exactly the actions each task needs.
    let expected: BTreeMap<&str, BTreeSet<String>> = [(
        "EmailSendTaskRole",
        ["ses:SendEmail SesIdentityArns", "ses:SendRawEmail SesIdentityArns"].iter().map(|s| (*s).to_owned()).collect(),
    )]
    .into_iter()
    .collect();
    assert_eq!(roles.keys().map(String::as_str).collect::<BTreeSet<_>>(), expected.keys().copied().collect());
    let executor_may = role_actions(&t, "ExecutorRole");
    for (name, role) in &roles {
        let p = &role["Properties"];
        assert_eq!(role_actions(&t, name), expected[name.as_str()], "{name}");
        assert!(p.get("ManagedPolicyArns").is_none(), "{name}: no managed policies");
        assert!(num(&p["MaxSessionDuration"]) <= 3600, "{name}: chained sessions last at most an hour");
        let trust = p["AssumeRolePolicyDocument"]["Statement"].as_array().unwrap();
        assert_eq!(trust.len(), 1, "{name}: one trust statement");
        assert_eq!(trust[0]["Effect"], "Allow");
        assert_eq!(trust[0]["Principal"].as_object().unwrap().len(), 1, "{name}: one kind of principal");
        assert_eq!(target(&trust[0]["Principal"]["AWS"]), "ExecutorRole", "{name} trusts the executor's role only");
        assert_eq!(trust[0]["Action"], json!(["sts:AssumeRole", "sts:TagSession"]), "{name}: assume with session tags");
        assert!(executor_may.contains(&format!("sts:AssumeRole {name}")), "the executor may assume {name}");
    }
    // The executor's mapping names every task role and parses as the executor reads it.
    let vars = &t["Resources"]["ExecutorFunction"]["Properties"]["Environment"]["Variables"];
    let mapping = vars["RELAY_TASK_ROLES"]["Fn::Sub"].as_str().expect("RELAY_TASK_ROLES is a !Sub");
    let mut resolved = mapping.to_owned();
    for name in roles.keys() {
        assert!(mapping.contains(&format!("${{{name}.Arn}}")), "RELAY_TASK_ROLES maps {name}");
        resolved = resolved.replace(&format!("${{{name}.Arn}}"), &format!("arn:aws:iam::123456789012:role/stack-{name}-X1"));
    }
    let secs = vars["RELAY_TASK_SESSION_SECONDS"].as_str().unwrap().to_owned();
    let env = |k: &str| match k {
        "RELAY_TASK_ROLES" => Some(resolved.clone()),
        "RELAY_TASK_SESSION_SECONDS" => Some(secs.clone()),
        _ => None,
    };
    let parsed = taskdeck::credentials::TaskRoles::from_lookup(env).expect("the executor accepts the template's mapping");
    let anyone = uuid::Uuid::now_v7();
    assert!(parsed.resolve(anyone, "email.send").is_some());
    assert!(parsed.resolve(anyone, "noop").is_none(), "default deny for everything else");
    assert_eq!(target(&vars["RELAY_TENANT_TASK_ROLES"]), "TenantTaskRoles");
}

#[test]
fn the_alarms_that_page_exist() {
    let t = template();
    let alarms: Vec<&Value> =
        t["Resources"].as_object().unwrap().values().filter(|r| r["Type"] == "AWS::CloudWatch::Alarm").collect();
    let watching = |metric: &str, dim: &str| {
        alarms.iter().any(|a| a["Properties"]["MetricName"] == metric && target(&a["Properties"]["Dimensions"][0]["Value"]) == dim)
    };
    for dlq in ["WorkDeadLetterQueue", "IngressDeadLetterQueue"] {
        assert!(watching("ApproximateNumberOfMessagesVisible", dlq), "dead-letter depth of {dlq}");
    }
    for q in ["WorkQueue", "IngressQueue"] {
        assert!(watching("ApproximateAgeOfOldestMessage", q), "oldest message in {q}");
    }
    for f in functions(&t).keys() {
        assert!(watching("Errors", f), "errors of {f}");
    }
    let sweep = alarms
        .iter()
        .find(|a| a["Properties"]["MetricName"] == "Invocations" && target(&a["Properties"]["Dimensions"][0]["Value"]) == "SweeperFunction")
        .expect("a sweep-not-running alarm");
    assert_eq!(sweep["Properties"]["TreatMissingData"], "breaching", "no data means no sweep");
}
