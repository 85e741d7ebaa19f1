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

/// Every action a role allows, by resource target.
fn role_actions(t: &Value, role: &str) -> BTreeSet<String> {
    let r = &t["Resources"][role]["Properties"];
    let mut actions = BTreeSet::new();
    for p in r["Policies"].as_array().into_iter().flatten() {
        for s in p["PolicyDocument"]["Statement"].as_array().unwrap() {
            assert_eq!(s["Effect"], "Allow");
            for a in s["Action"].as_array().cloned().unwrap_or_else(|| vec![s["Action"].clone()]) {
                let res = &s["Resource"];
                let on = if res.get("Fn::Sub").is_some() { "task-roles".to_owned() } else { target(res) };
                actions.insert(format!("{} {on}", a.as_str().unwrap()));
            }
        }
    }
    actions
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
    assert!(console.get("Environment").is_none() && console.get("VpcConfig").is_none(), "the console stands alone");
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
                "sts:AssumeRole task-roles",
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
    let task_roles = t["Resources"]["ExecutorRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["Action"] == json!(["sts:AssumeRole"]))
        .map(|s| s["Resource"]["Fn::Sub"].as_str().unwrap().to_owned())
        .unwrap();
    assert!(task_roles.ends_with(":role/${TaskRolePrefix}*"), "only task roles: {task_roles}");
    assert!(t["Resources"]["ConsoleRole"]["Properties"].get("ManagedPolicyArns").is_none());
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
