//! The SAM template's invariants, which cfn-lint does not check: a bad edit fails CI here.
//! (cfn-lint misses a misspelled `ReportBatchItemFailures`, `BatchSize: 0`, a bogus runtime.)

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

/// The platform template as JSON, with short-form intrinsics (`!Ref x`) in long form (`{"Ref": x}`).
pub(crate) fn template() -> Value {
    load("template.yaml")
}

/// The console's own template.
pub(crate) fn console() -> Value {
    load("console.yaml")
}

pub(crate) fn load(name: &str) -> Value {
    let path = format!("{}/../../infra/{name}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
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

/// The logical id a `!GetAtt X.Arn` / `!Ref X` names (a `!Sub`: its text, a literal: itself).
fn target(v: &Value) -> String {
    if let Some(r) = v.get("Ref") {
        return r.as_str().unwrap().to_owned();
    }
    if let Some(sub) = v.get("Fn::Sub") {
        return sub.as_str().or_else(|| sub[0].as_str()).unwrap().to_owned();
    }
    if let Some(literal) = v.as_str() {
        return literal.to_owned();
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
        p["Type"] == "AWS::IAM::Policy"
            && p["Properties"]["Roles"].as_array().unwrap().iter().any(|x| target(x) == role)
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
fn arm64_traced_cargo_lambda_functions_one_per_workspace_crate() {
    let mut binaries = BTreeSet::new();
    for t in [template(), console()] {
        let g = &t["Globals"]["Function"];
        for (name, f) in functions(&t) {
            let p = &f["Properties"];
            let setting = |key: &str| p.get(key).unwrap_or(&g[key]).clone();
            assert_eq!(setting("Runtime"), "provided.al2023", "{name}");
            assert_eq!(setting("Architectures"), json!(["arm64"]), "{name}");
            assert_eq!(setting("Handler"), "bootstrap", "{name}");
            assert_eq!(setting("Tracing"), "Active", "{name}: active tracing");
            assert_eq!(p["LoggingConfig"]["LogFormat"], "JSON", "{name}: JSON logs (the Powertools shape)");
            assert_eq!(f["Metadata"]["BuildMethod"], "rust-cargolambda");
            assert_eq!(p["CodeUri"], "..", "the workspace root");
            binaries.insert(f["Metadata"]["BuildProperties"]["Binary"].as_str().unwrap().to_owned());
        }
    }
    assert!(!functions(&template()).contains_key("ConsoleFunction"), "the console is not in the platform stack");
    let members: BTreeSet<String> = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../functions"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().join("Cargo.toml").exists())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(binaries, members);
    assert_eq!(binaries.len(), 7, "intake, executor (two lanes), sweeper, ingress, pretraffic, admin, console");
    let workspace = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml")).unwrap();
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
            assert_eq!(
                e["FunctionResponseTypes"],
                json!(["ReportBatchItemFailures"]),
                "{name}: partial batch responses"
            );
            assert!((1..=10).contains(&num(&e["BatchSize"])), "{name}: BatchSize 1..=10");
            let max_conc = num(&e["ScalingConfig"]["MaximumConcurrency"]);
            assert!(max_conc >= 2, "{name}: SQS MaximumConcurrency is at least 2");
            assert!(
                max_conc <= num(&p["ReservedConcurrentExecutions"]),
                "{name}: MaximumConcurrency within reserved concurrency"
            );
            let queue = &res[target(&e["Queue"])]["Properties"];
            assert!(
                num(&queue["VisibilityTimeout"]) >= 6 * num(&p["Timeout"]),
                "{name}: visibility timeout at least 6 x the function timeout"
            );
            let redrive = &queue["RedrivePolicy"];
            assert!(num(&redrive["maxReceiveCount"]) >= 5, "{name}: maxReceiveCount >= 5");
            let dlq = target(&redrive["deadLetterTargetArn"]);
            assert_eq!(res[&dlq]["Type"], "AWS::SQS::Queue", "{name}: a dead-letter queue");
            assert!(
                num(&res[&dlq]["Properties"]["MessageRetentionPeriod"]) >= 1_209_600,
                "{dlq} keeps messages 14 days"
            );
        }
    }
    assert_eq!(sqs_events, 3, "the executor's two lanes and ingress consume SQS");
}

#[test]
fn the_executor_lease_outlasts_the_executor_timeout() {
    let t = template();
    for f in ["ExecutorFunction", "LongExecutorFunction"] {
        let p = &t["Resources"][f]["Properties"];
        let lease = num(&p["Environment"]["Variables"]["RELAY_LEASE_SECONDS"]);
        assert!(lease > num(&p["Timeout"]), "{f}: lease {lease} must exceed the function timeout");
        // Every function that reads RELAY_LEASE_SECONDS gets a valid value.
        let cfg =
            taskdeck::config::LambdaConfig::from_lookup(|k| (k == "RELAY_LEASE_SECONDS").then(|| lease.to_string()));
        assert_eq!(cfg.unwrap().lease.as_secs(), u64::try_from(lease).unwrap());
    }
}

/// A function's environment as the function reads it (`LambdaConfig`), intrinsics replaced by
/// sample values.
fn config_of(t: &Value, function: &str) -> taskdeck::config::LambdaConfig {
    let vars = t["Resources"][function]["Properties"]["Environment"]["Variables"].as_object().unwrap().clone();
    // Literal values as they are; a queue's `!Ref` as a URL naming the queue; other intrinsics
    // (the task roles' `!Sub`, the database URL) left out.
    let get = move |k: &str| {
        let v = vars.get(k)?;
        match v.as_str() {
            Some(text) => Some(text.to_owned()),
            None if k.ends_with("_URL") => Some(format!("https://sqs.eu-west-1.amazonaws.com/1/{}", target(v))),
            None => None,
        }
    };
    taskdeck::config::LambdaConfig::from_lookup(|k| if k == "DATABASE_URL" { None } else { get(k) }).unwrap()
}

/// Intake's limit, the short lane's hand-over and the long lane's time all come from the
/// functions' real timeouts: intake refuses what no invocation can give, the short lane sends
/// on what it cannot give, the long lane takes one job at a time.
#[test]
fn the_lanes_and_intake_agree_on_the_executors_timeouts() {
    let t = template();
    let res = &t["Resources"];
    let timeout = |f: &str| u64::try_from(num(&res[f]["Properties"]["Timeout"])).unwrap();
    let (short, long) = (timeout("ExecutorFunction"), timeout("LongExecutorFunction"));
    assert!(short < long, "the long lane is the longer one");
    for f in ["IntakeFunction", "ExecutorFunction", "LongExecutorFunction"] {
        let cfg = config_of(&t, f);
        assert_eq!(
            cfg.executor_timeout.as_secs(),
            long,
            "{f}: RELAY_EXECUTOR_TIMEOUT_SECONDS is the long lane's Timeout"
        );
        assert_eq!(cfg.deadline_reserve.as_secs(), 5, "{f}: one reserve for all");
        assert_eq!(i64::from(cfg.max_job_timeout()), i64::try_from(long).unwrap() - 5);
    }
    let short_cfg = config_of(&t, "ExecutorFunction");
    let (above, queue) = short_cfg.onward().expect("the short lane hands longer jobs on");
    assert_eq!(i64::from(above), i64::try_from(short).unwrap() - 5, "RELAY_LANE_TIMEOUT_SECONDS is its own Timeout");
    assert!(queue.ends_with("/LongWorkQueue"), "{queue}");
    assert!(config_of(&t, "LongExecutorFunction").onward().is_none(), "the long lane is the last");
    let long_event = res["LongExecutorFunction"]["Properties"]["Events"].as_object().unwrap().values().next().unwrap();
    assert_eq!(target(&long_event["Properties"]["Queue"]), "LongWorkQueue");
    assert_eq!(num(&long_event["Properties"]["BatchSize"]), 1, "one long job per invocation");
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
}

#[test]
fn the_console_deploys_without_the_platform_stack() {
    let c = console();
    let console = &c["Resources"]["ConsoleFunction"]["Properties"];
    assert!(console.get("VpcConfig").is_none(), "the console stands alone: no VPC, no database");
    let env: Vec<&String> =
        console["Environment"]["Variables"].as_object().map(|m| m.keys().collect()).unwrap_or_default();
    assert_eq!(
        env,
        ["RELAY_CONSOLE_PROJECTS", "RELAY_CONSOLE_TOKENS_SECRET"],
        "the console gets its projects and the name of its tokens' secret, nothing else"
    );
    assert!(c["Parameters"]["ConsoleProjects"].get("NoEcho").is_none(), "no token in the projects parameter");
    // Nothing imported from another stack: every reference is to its own parameters or resources.
    let text = serde_json::to_string(&c).unwrap();
    assert!(!text.contains("Fn::ImportValue"), "the console imports nothing");
    let own: BTreeSet<&String> =
        c["Resources"].as_object().unwrap().keys().chain(c["Parameters"].as_object().unwrap().keys()).collect();
    for r in refs(&c["Resources"]) {
        assert!(r.starts_with("AWS::") || own.contains(&r), "the console refers to {r}, not its own");
    }
    let set = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<String>>();
    assert_eq!(target(&console["Role"]), "ConsoleRole");
    assert_eq!(
        role_actions(&c, "ConsoleRole"),
        set(&[
            "logs:CreateLogStream ConsoleLogGroup",
            "logs:PutLogEvents ConsoleLogGroup",
            "xray:PutTraceSegments *",
            "xray:PutTelemetryRecords *",
            "secretsmanager:GetSecretValue ConsoleTokensSecretArn",
        ])
    );
    assert!(c["Resources"]["ConsoleRole"]["Properties"].get("ManagedPolicyArns").is_none());
    assert!(
        c["Resources"].as_object().unwrap().values().any(|r| r["Type"] == "AWS::CloudWatch::Alarm"),
        "console errors page"
    );
}

/// Every logical id a `Ref`, `GetAtt` or `Sub` under `v` names.
fn refs(v: &Value) -> Vec<String> {
    let mut out = Vec::new();
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                match (k.as_str(), x) {
                    ("Ref", Value::String(s)) => out.push(s.clone()),
                    ("Fn::GetAtt", _) => out.push(target(&json!({"Fn::GetAtt": x}))),
                    ("Fn::Sub", _) => {
                        let text = x.as_str().or_else(|| x[0].as_str()).unwrap_or_default();
                        let vars: BTreeSet<String> = x
                            .get(1)
                            .and_then(Value::as_object)
                            .map(|m| m.keys().cloned().collect())
                            .unwrap_or_default();
                        for part in text.split("${").skip(1) {
                            let name = part.split('}').next().unwrap().split('.').next().unwrap();
                            if !vars.contains(name) {
                                out.push(name.to_owned());
                            }
                        }
                        out.extend(refs(x));
                    }
                    _ => out.extend(refs(x)),
                }
            }
        }
        Value::Array(a) => a.iter().for_each(|x| out.extend(refs(x))),
        _ => {}
    }
    out
}

#[test]
fn each_function_has_its_own_least_privilege_role() {
    let t = template();
    let set = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<String>>();
    let expected = [
        (
            "IntakeFunction",
            "IntakeRole",
            set(&[
                "logs:CreateLogStream IntakeLogGroup",
                "logs:PutLogEvents IntakeLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "sqs:SendMessage WorkQueue",
                "secretsmanager:CreateSecret arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/*/destinations/*",
                "secretsmanager:PutSecretValue arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/*/destinations/*",
                "secretsmanager:DeleteSecret arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/*/destinations/*",
            ]),
        ),
        (
            "ExecutorFunction",
            "ExecutorRole",
            set(&[
                "logs:CreateLogStream ExecutorLogGroup",
                "logs:PutLogEvents ExecutorLogGroup",
                "logs:CreateLogStream LongExecutorLogGroup",
                "logs:PutLogEvents LongExecutorLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "sqs:ReceiveMessage WorkQueue",
                "sqs:DeleteMessage WorkQueue",
                "sqs:GetQueueAttributes WorkQueue",
                "sqs:SendMessage WorkQueue",
                "sqs:ReceiveMessage LongWorkQueue",
                "sqs:DeleteMessage LongWorkQueue",
                "sqs:GetQueueAttributes LongWorkQueue",
                "sqs:SendMessage LongWorkQueue",
                "sts:AssumeRole EmailSendTaskRole",
                "sts:TagSession EmailSendTaskRole",
                "sts:AssumeRole HttpRequestTaskRole",
                "sts:TagSession HttpRequestTaskRole",
                "sts:AssumeRole WebhookSendTaskRole",
                "sts:TagSession WebhookSendTaskRole",
                "sts:AssumeRole TenantTaskRoleArns",
                "sts:TagSession TenantTaskRoleArns",
            ]),
        ),
        // The same code in its long lane: the same role (the task roles trust one principal).
        (
            "LongExecutorFunction",
            "ExecutorRole",
            set(&[
                "logs:CreateLogStream ExecutorLogGroup",
                "logs:PutLogEvents ExecutorLogGroup",
                "logs:CreateLogStream LongExecutorLogGroup",
                "logs:PutLogEvents LongExecutorLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "sqs:ReceiveMessage WorkQueue",
                "sqs:DeleteMessage WorkQueue",
                "sqs:GetQueueAttributes WorkQueue",
                "sqs:SendMessage WorkQueue",
                "sqs:ReceiveMessage LongWorkQueue",
                "sqs:DeleteMessage LongWorkQueue",
                "sqs:GetQueueAttributes LongWorkQueue",
                "sqs:SendMessage LongWorkQueue",
                "sts:AssumeRole EmailSendTaskRole",
                "sts:TagSession EmailSendTaskRole",
                "sts:AssumeRole HttpRequestTaskRole",
                "sts:TagSession HttpRequestTaskRole",
                "sts:AssumeRole WebhookSendTaskRole",
                "sts:TagSession WebhookSendTaskRole",
                "sts:AssumeRole TenantTaskRoleArns",
                "sts:TagSession TenantTaskRoleArns",
            ]),
        ),
        (
            "SweeperFunction",
            "SweeperRole",
            set(&[
                "logs:CreateLogStream SweeperLogGroup",
                "logs:PutLogEvents SweeperLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                // The SES account's send rate and quota: GetAccount has no resource-level permissions.
                "ses:GetAccount *",
                "sqs:SendMessage WorkQueue",
            ]),
        ),
        (
            "IngressFunction",
            "IngressRole",
            set(&[
                "logs:CreateLogStream IngressLogGroup",
                "logs:PutLogEvents IngressLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "sqs:ReceiveMessage IngressQueue",
                "sqs:DeleteMessage IngressQueue",
                "sqs:GetQueueAttributes IngressQueue",
                "sqs:SendMessage WorkQueue",
            ]),
        ),
        (
            "PreTrafficFunction",
            "PreTrafficRole",
            set(&[
                "logs:CreateLogStream PreTrafficLogGroup",
                "logs:PutLogEvents PreTrafficLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "lambda:InvokeFunction ${IntakeFunction.Arn}:*",
                "lambda:InvokeFunction ${ExecutorFunction.Arn}:*",
                "lambda:InvokeFunction ${LongExecutorFunction.Arn}:*",
                "lambda:InvokeFunction ${SweeperFunction.Arn}:*",
                "lambda:InvokeFunction ${IngressFunction.Arn}:*",
                "codedeploy:PutLifecycleEventHookExecutionStatus arn:${AWS::Partition}:codedeploy:${AWS::Region}:${AWS::AccountId}:deploymentgroup:${ServerlessDeploymentApplication}/*",
            ]),
        ),
        (
            "AdminFunction",
            "AdminRole",
            set(&[
                "logs:CreateLogStream AdminLogGroup",
                "logs:PutLogEvents AdminLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "sqs:ReceiveMessage WorkDeadLetterQueue",
                "sqs:DeleteMessage WorkDeadLetterQueue",
                "sqs:ReceiveMessage IngressDeadLetterQueue",
                "sqs:DeleteMessage IngressDeadLetterQueue",
                "sqs:SendMessage WorkQueue",
                "sqs:SendMessage IngressQueue",
            ]),
        ),
    ];
    assert_eq!(
        expected.iter().map(|(f, _, _)| (*f).to_owned()).collect::<BTreeSet<_>>(),
        functions(&t).keys().cloned().collect(),
        "every function's actions are listed here"
    );
    for (function, role, actions) in expected {
        let p = &t["Resources"][function]["Properties"];
        assert_eq!(target(&p["Role"]), role, "{function} has its own role");
        assert!(p.get("Policies").is_none(), "{function}: no SAM policy templates (they grant on *)");
        assert_eq!(role_actions(&t, role), actions, "{role}");
        let managed: Vec<String> =
            t["Resources"][role]["Properties"]["ManagedPolicyArns"].as_array().unwrap().iter().map(target).collect();
        assert_eq!(managed, ["VpcAccessPolicy", "XrayWritePolicy"], "{role}: VPC interfaces and tracing only");
    }
}

#[test]
fn each_task_type_has_its_own_role_trusting_only_the_executor() {
    let t = template();
    let roles = task_roles(&t);
    assert!(!roles.is_empty());
    // Exactly the actions each task needs.
    let config_set = "arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:configuration-set/${Name}";
    let expected: BTreeMap<&str, BTreeSet<String>> = [(
        "EmailSendTaskRole",
        [
            "ses:SendEmail SesIdentityArns".to_owned(),
            "ses:SendRawEmail SesIdentityArns".to_owned(),
            format!("ses:SendEmail {config_set}"),
            format!("ses:SendRawEmail {config_set}"),
        ]
        .into_iter()
        .collect(),
    ), (
        "HttpRequestTaskRole",
        // Only the session's own tenant's (the relay:tenant session tag, credentials/session.rs).
        ["secretsmanager:GetSecretValue arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/${!aws:PrincipalTag/relay:tenant}/destinations/*".to_owned()]
            .into_iter()
            .collect(),
    ), (
        "WebhookSendTaskRole",
        // The same: its destinations' auth and signing secrets, the session's own tenant's only.
        ["secretsmanager:GetSecretValue arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/${!aws:PrincipalTag/relay:tenant}/destinations/*".to_owned()]
            .into_iter()
            .collect(),
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
        resolved =
            resolved.replace(&format!("${{{name}.Arn}}"), &format!("arn:aws:iam::123456789012:role/stack-{name}-X1"));
    }
    let secs = vars["RELAY_TASK_SESSION_SECONDS"].as_str().unwrap().to_owned();
    let env = |k: &str| match k {
        "RELAY_TASK_ROLES" => Some(resolved.clone()),
        "RELAY_TASK_SESSION_SECONDS" => Some(secs.clone()),
        _ => None,
    };
    let parsed =
        taskdeck::credentials::TaskRoles::from_lookup(env).expect("the executor accepts the template's mapping");
    let anyone = taskdeck::job::TenantId::new();
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
        alarms.iter().any(|a| {
            a["Properties"]["MetricName"] == metric && target(&a["Properties"]["Dimensions"][0]["Value"]) == dim
        })
    };
    for dlq in ["WorkDeadLetterQueue", "IngressDeadLetterQueue"] {
        assert!(watching("ApproximateNumberOfMessagesVisible", dlq), "dead-letter depth of {dlq}");
    }
    for q in ["WorkQueue", "IngressQueue"] {
        assert!(watching("ApproximateAgeOfOldestMessage", q), "oldest message in {q}");
    }
    // The hook's failure is the deploy's; the admin function's is its caller's answer.
    for f in functions(&t).keys().filter(|f| !["PreTrafficFunction", "AdminFunction"].contains(&f.as_str())) {
        assert!(watching("Errors", f), "errors of {f}");
    }
    assert!(watching("ApproximateAgeOfOldestMessage", "LongWorkQueue"), "oldest message in the long lane");
    for metric in ["5xx", "Latency"] {
        assert!(watching(metric, "HttpApi"), "API Gateway {metric}");
    }
    // The outage alarms read what the functions print in EMF, summed over every function
    // (no dimension), in the namespace every function is given.
    let namespace = &t["Globals"]["Function"]["Environment"]["Variables"]["POWERTOOLS_METRICS_NAMESPACE"];
    for metric in ["DatabaseErrors", "BatchItemFailures"] {
        let a = alarms
            .iter()
            .find(|a| a["Properties"]["MetricName"] == metric && a["Properties"].get("Dimensions").is_none())
            .unwrap_or_else(|| panic!("an alarm on {metric} summed over every function"));
        assert!(taskdeck::metrics::emf::AGGREGATED.contains(&metric), "{metric} is published without a dimension");
        assert_eq!(&a["Properties"]["Namespace"], namespace, "{metric}");
        assert!(a["Properties"].get("Dimensions").is_none(), "{metric}: the sum over every function");
    }
    let sweep = alarms
        .iter()
        .find(|a| {
            a["Properties"]["MetricName"] == "Invocations"
                && target(&a["Properties"]["Dimensions"][0]["Value"]) == "SweeperFunction"
        })
        .expect("a sweep-not-running alarm");
    assert_eq!(sweep["Properties"]["TreatMissingData"], "breaching", "no data means no sweep");
}

#[test]
fn queues_and_log_groups_survive_a_stack_deletion_or_replacement() {
    for t in [template(), console()] {
        let mut kept = 0;
        for (name, r) in t["Resources"].as_object().unwrap() {
            if r["Type"] == "AWS::SQS::Queue" || r["Type"] == "AWS::Logs::LogGroup" {
                assert_eq!(r["DeletionPolicy"], "Retain", "{name}: DeletionPolicy");
                assert_eq!(r["UpdateReplacePolicy"], "Retain", "{name}: UpdateReplacePolicy");
                kept += 1;
            }
        }
        assert!(kept > 0);
    }
}

#[test]
fn every_alarm_pages_a_topic_that_always_exists() {
    for t in [template(), console()] {
        let res = &t["Resources"];
        assert_eq!(t["Conditions"]["CreateAlarmTopic"], json!({"Fn::Equals": [{"Ref": "AlarmTopicArn"}, ""]}));
        assert_eq!(res["AlarmTopic"]["Type"], "AWS::SNS::Topic");
        assert_eq!(res["AlarmTopic"]["Condition"], "CreateAlarmTopic", "created exactly when none is given");
        let sub = &res["AlarmEmailSubscription"];
        assert_eq!(
            (sub["Properties"]["Protocol"].as_str(), target(&sub["Properties"]["TopicArn"])),
            (Some("email"), "AlarmTopic".into())
        );
        let page = json!([{"Fn::If": ["CreateAlarmTopic", {"Ref": "AlarmTopic"}, {"Ref": "AlarmTopicArn"}]}]);
        for (name, r) in res.as_object().unwrap().iter().filter(|(_, r)| r["Type"] == "AWS::CloudWatch::Alarm") {
            assert_eq!(r["Properties"]["AlarmActions"], page, "{name} pages the alarm topic");
        }
    }
}

#[test]
fn ses_events_flow_from_a_configuration_set_through_a_topic_into_the_ingress_queue() {
    let t = template();
    let res = &t["Resources"];
    let topic = json!({"Fn::If": ["CreateSesEventTopic", {"Ref": "SesEventTopic"}, {"Ref": "SesEventTopicArn"}]});
    let dest = &res["SesEventDestination"]["Properties"];
    assert_eq!(target(&dest["ConfigurationSetName"]), "SesConfigurationSet");
    assert_eq!(dest["EventDestination"]["Enabled"], true);
    assert_eq!(dest["EventDestination"]["SnsDestination"]["TopicARN"], topic, "events go to the topic");
    let types: BTreeSet<&str> =
        dest["EventDestination"]["MatchingEventTypes"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for needed in ["send", "delivery", "bounce", "complaint", "reject", "open", "click", "deliveryDelay"] {
        assert!(types.contains(needed), "the destination publishes {needed}");
    }
    let sub = &res["SesEventSubscription"]["Properties"];
    assert_eq!((sub["Protocol"].as_str(), &sub["TopicArn"]), (Some("sqs"), &topic), "the topic is subscribed");
    assert_eq!(target(&sub["Endpoint"]), "IngressQueue");
    assert_eq!(sub["RawMessageDelivery"], false, "ingress parses the SNS envelope");
    let policy = &res["IngressQueuePolicy"]["Properties"]["PolicyDocument"]["Statement"][0];
    assert_eq!(policy["Condition"]["ArnLike"]["aws:SourceArn"][0], topic, "that topic may deliver");
    assert_eq!(
        policy["Condition"]["ArnLike"]["aws:SourceArn"].as_array().map(Vec::len),
        Some(2),
        "and this stack's own <stack>_* topics, nothing else (tests/policies.rs evaluates it)"
    );
    // Created unless given, both of them.
    assert_eq!(res["SesEventTopic"]["Condition"], "CreateSesEventTopic");
    assert_eq!(res["SesConfigurationSet"]["Condition"], "CreateSesConfigurationSet");
    assert_eq!(t["Conditions"]["CreateSesEventTopic"], json!({"Fn::Equals": [{"Ref": "SesEventTopicArn"}, ""]}));
    assert_eq!(
        t["Conditions"]["CreateSesConfigurationSet"],
        json!({"Fn::Equals": [{"Ref": "SesConfigurationSetName"}, ""]})
    );
    // The email task role covers the very set sends name.
    let statements = res["EmailSendTaskRole"]["Properties"]["Policies"][0]["PolicyDocument"]["Statement"]
        .as_array()
        .unwrap()
        .clone();
    let on_set = statements
        .iter()
        .find(|s| s["Resource"].get("Fn::Sub").is_some())
        .expect("a statement on the configuration set");
    assert_eq!(
        on_set["Resource"]["Fn::Sub"][1]["Name"],
        json!({"Fn::If": ["CreateSesConfigurationSet", {"Ref": "SesConfigurationSet"}, {"Ref": "SesConfigurationSetName"}]})
    );
    assert_eq!(t["Outputs"]["SesConfigurationSet"]["Value"], on_set["Resource"]["Fn::Sub"][1]["Name"]);
}

#[test]
fn vpc_endpoints_cover_every_aws_service_the_functions_call_behind_one_switch() {
    let t = template();
    let endpoints: BTreeMap<String, &Value> = t["Resources"]
        .as_object()
        .unwrap()
        .values()
        .filter(|r| r["Type"] == "AWS::EC2::VPCEndpoint")
        .map(|r| {
            (r["Properties"]["ServiceName"]["Fn::Sub"].as_str().unwrap().rsplit('.').next().unwrap().to_owned(), r)
        })
        .collect();
    assert_eq!(
        endpoints.keys().map(String::as_str).collect::<Vec<_>>(),
        ["codedeploy", "email", "lambda", "secretsmanager", "sqs", "sts"]
    );
    for (service, e) in endpoints {
        assert_eq!(e["Condition"], "WithVpcEndpoints", "{service}");
        let p = &e["Properties"];
        assert_eq!(
            (p["VpcEndpointType"].as_str(), p["PrivateDnsEnabled"].as_bool()),
            (Some("Interface"), Some(true)),
            "{service}"
        );
        assert_eq!(target(&p["SubnetIds"]), "SubnetIds", "{service}: in the functions' subnets");
    }
}

/// The template's `DATABASE_URL`, its parameters replaced by sample values.
fn resolved_database_url(p: &Value) -> String {
    let url =
        p["Environment"]["Variables"]["DATABASE_URL"]["Fn::Sub"].as_str().expect("DATABASE_URL is a !Sub").to_owned();
    [
        ("DatabaseUser", "relay"),
        ("DatabaseProxyEndpoint", "relay.proxy-x.eu-west-1.rds.amazonaws.com"),
        ("DatabaseName", "relay"),
        ("DatabaseRootCert", "system"),
    ]
    .iter()
    .fold(url, |u, (k, v)| u.replace(&format!("${{{k}}}"), v))
}

#[test]
fn no_database_password_in_the_environment_and_tls_verified_in_full() {
    let t = template();
    let mut with_db = 0;
    for (name, f) in functions(&t) {
        let p = &f["Properties"];
        let vars = &p["Environment"]["Variables"];
        if vars.get("DATABASE_URL").is_none() {
            continue;
        }
        with_db += 1;
        let text = serde_json::to_string(vars).unwrap();
        assert!(
            !text.contains("resolve:secretsmanager") && !text.to_lowercase().contains("password"),
            "{name}: {text}"
        );
        assert_eq!(target(&vars["RELAY_DATABASE_SECRET"]), "DatabaseSecretArn", "{name} reads the login at run time");
        let role = target(&p["Role"]);
        assert!(
            role_actions(&t, &role).contains("secretsmanager:GetSecretValue DatabaseSecretArn"),
            "{role} may read it"
        );
        // What the function itself makes of it on AWS: verify-full, no password.
        let url = resolved_database_url(p);
        let env = |k: &str| match k {
            "DATABASE_URL" => Some(url.clone()),
            "AWS_LAMBDA_FUNCTION_NAME" => Some(name.clone()),
            _ => None,
        };
        let cfg = taskdeck::config::LambdaConfig::from_lookup(env).expect("the functions accept the template's URL");
        let parsed = taskdeck::store::tls::DbUrl::parse(cfg.require_database_url().unwrap()).unwrap();
        assert_eq!(parsed.mode, taskdeck::store::tls::SslMode::VerifyFull, "{name}");
        assert!(parsed.config.get_password().is_none(), "{name}: no password in the URL");
    }
    assert_eq!(with_db, 7);
}

#[test]
fn dead_letters_are_counted_by_log_events_the_code_really_emits_and_page() {
    let t = template();
    let res = t["Resources"].as_object().unwrap();
    let source: String = ["executor.rs", "ingress.rs"]
        .iter()
        .map(|f| std::fs::read_to_string(format!("{}/../core/src/lambda/{f}", env!("CARGO_MANIFEST_DIR"))).unwrap())
        .collect();
    // Each place a dead letter is kept logs one line with a stable event name and says so.
    let kept_at: BTreeSet<String> = source
        .split("event = \"")
        .skip(1)
        .filter_map(|rest| {
            let (event, after) = rest.split_once('"')?;
            let line = &after[..after.find(");").unwrap_or(after.len())];
            line.contains("kept in dead_letters").then(|| event.to_owned())
        })
        .collect();
    assert!(kept_at.len() >= 3, "{kept_at:?}");
    let mut counted = BTreeSet::new();
    for f in res.values().filter(|r| r["Type"] == "AWS::Logs::MetricFilter") {
        let m = &f["Properties"]["MetricTransformations"][0];
        if m["MetricName"] != "DeadLetters" {
            continue;
        }
        assert_eq!(m["MetricValue"], "1");
        let pattern = f["Properties"]["FilterPattern"].as_str().unwrap();
        for part in pattern.split("$.event = \"").skip(1) {
            counted.insert(part.split('"').next().unwrap().to_owned());
        }
    }
    assert_eq!(counted, kept_at, "every dead-letter event is counted, and only those");
    let alarm = res
        .values()
        .find(|r| r["Type"] == "AWS::CloudWatch::Alarm" && r["Properties"]["MetricName"] == "DeadLetters")
        .expect("an alarm on DeadLetters");
    assert_eq!(
        (alarm["Properties"]["Threshold"].as_i64(), alarm["Properties"]["ComparisonOperator"].as_str()),
        (Some(0), Some("GreaterThanThreshold"))
    );
}

#[test]
fn the_api_writes_access_logs_to_a_kept_log_group() {
    let t = template();
    let settings = &t["Resources"]["HttpApi"]["Properties"]["AccessLogSettings"];
    let group = target(&settings["DestinationArn"]);
    assert_eq!(t["Resources"][&group]["Type"], "AWS::Logs::LogGroup");
    let format = settings["Format"].as_str().unwrap();
    for field in ["$context.requestId", "$context.status", "$context.integrationErrorMessage"] {
        assert!(format.contains(field), "access logs carry {field}");
    }
}

/// A deploy proves itself: every function but the hook is published through an alias and
/// deployed by CodeDeploy with the hook before traffic and alarms that roll it back; the hook
/// is named so SAM's CodeDeploy role may invoke it, and checks the versions being deployed.
#[test]
fn every_function_deploys_through_an_alias_gated_by_the_hook_and_rolled_back_by_alarms() {
    let t = template();
    let res = &t["Resources"];
    let mut gated = BTreeSet::new();
    for (name, f) in functions(&t) {
        let p = &f["Properties"];
        if name == "PreTrafficFunction" || name == "AdminFunction" {
            assert!(p.get("DeploymentPreference").is_none(), "{name} is not deployed through CodeDeploy");
            continue;
        }
        assert_eq!(p["AutoPublishAlias"], "live", "{name}");
        let d = &p["DeploymentPreference"];
        let shape = d["Type"].as_str().unwrap();
        // The sweeper runs once a minute: a 10 % canary for 5 minutes gives its new version
        // about half a pass; ten linear steps give it about five.
        let expected =
            if name == "SweeperFunction" { "Linear10PercentEvery1Minute" } else { "Canary10Percent5Minutes" };
        assert_eq!(shape, expected, "{name}");
        assert_eq!(d["Hooks"]["PreTraffic"], json!({"Ref": "PreTrafficFunction"}), "{name}");
        let alarms = d["Alarms"].as_array().expect("rollback alarms");
        let version = json!({"Fn::GetAtt": format!("{name}.Version.Version")});
        let mut watched = BTreeSet::new();
        for a in alarms {
            let alarm = &res[target(a)];
            assert_eq!(alarm["Type"], "AWS::CloudWatch::Alarm", "{name}");
            // Only the new version's own metric: a dimension naming this deployment's version.
            let dims = alarm["Properties"]["Dimensions"].as_array().unwrap();
            assert!(
                dims.iter().any(|d| ["ExecutedVersion", "function_version"].contains(&d["Name"].as_str().unwrap())
                    && d["Value"] == version),
                "{name}: {} reads the new version only",
                target(a)
            );
            assert!(
                !refs(alarm).contains(&"HttpApi".to_owned()),
                "{name}: no alarm of the gate names the API (a cycle)"
            );
            watched.insert(alarm["Properties"]["MetricName"].as_str().unwrap().to_owned());
        }
        for metric in ["Errors", "DatabaseErrors"] {
            assert!(watched.contains(metric), "{name}: the new version's {metric} roll it back");
        }
        let emf_per_version = alarms.iter().filter(|a| res[target(a)]["Properties"]["Namespace"] != "AWS/Lambda");
        for a in emf_per_version {
            let metric = res[target(a)]["Properties"]["MetricName"].as_str().unwrap();
            assert!(taskdeck::metrics::emf::AGGREGATED.contains(&metric), "{metric} is published per version");
        }
        gated.insert(name);
    }
    assert_eq!(gated.len(), 5, "{gated:?}");
    let hook = &res["PreTrafficFunction"]["Properties"];
    assert!(hook["FunctionName"]["Fn::Sub"].as_str().unwrap().starts_with("CodeDeployHook_"));
    let vars = &hook["Environment"]["Variables"];
    assert_eq!(vars["RELAY_PRETRAFFIC_INTAKE"], json!({"Ref": "IntakeFunction.Version"}));
    assert_eq!(vars["RELAY_PRETRAFFIC_EXECUTOR"], json!({"Ref": "ExecutorFunction.Version"}));
    for (var, f) in [
        ("RELAY_PRETRAFFIC_EXECUTOR_LONG", "LongExecutorFunction"),
        ("RELAY_PRETRAFFIC_SWEEPER", "SweeperFunction"),
        ("RELAY_PRETRAFFIC_INGRESS", "IngressFunction"),
    ] {
        assert_eq!(vars[var], json!({"Ref": format!("{f}.Version")}), "the hook checks {f}'s new version");
    }
    assert_eq!(num(&hook["ReservedConcurrentExecutions"]), 1, "the hooks of one update run in turn");
}

/// Two stacks in one account and region: every name the template gives a resource (functions,
/// log groups, topics, the schedule, the configuration set) carries the stack's name, and the
/// sweeper's schedule has one (the default is the logical id, the same in every stack).
#[test]
fn a_second_stacks_names_do_not_collide() {
    let t = template();
    // (key path, value) of every name property, except dimensions' and an event destination's
    // (names inside another resource, not physical names).
    fn collect(v: &Value, at: &str, names: &mut Vec<(String, Value)>) {
        if let Value::Object(m) = v {
            for (k, x) in m.iter().filter(|(k, _)| !["Dimensions", "EventDestination"].contains(&k.as_str())) {
                let here = format!("{at}.{k}");
                if ["FunctionName", "TopicName", "LogGroupName", "Name"].contains(&k.as_str()) {
                    names.push((here.clone(), x.clone()));
                }
                collect(x, &here, names);
            }
        } else if let Value::Array(a) = v {
            a.iter().for_each(|x| collect(x, at, names));
        }
    }
    let mut names = Vec::new();
    for (id, r) in t["Resources"].as_object().unwrap() {
        // Alarms and IAM roles get generated names.
        if r["Type"] != "AWS::CloudWatch::Alarm" && !r["Type"].as_str().unwrap().starts_with("AWS::IAM") {
            collect(&r["Properties"], id, &mut names);
        }
    }
    assert!(names.len() >= 12, "{names:?}");
    let resolve = |v: &Value, stack: &str| v["Fn::Sub"].as_str().map(|s| s.replace("${AWS::StackName}", stack));
    let mut seen = BTreeSet::new();
    for (at, v) in names.iter().filter(|(_, v)| v.get("Ref").is_none() && v.get("Fn::GetAtt").is_none()) {
        // (A `!Ref`/`!GetAtt` names another resource, which is checked where it is declared.)
        let (a, b) = (resolve(v, "relay"), resolve(v, "relay-staging"));
        assert!(a.is_some() && a != b, "{at} = {v} does not carry the stack's name");
        assert!(seen.insert(a.unwrap()), "{at}: two resources share a name");
    }
    let sweep = t["Resources"]["SweeperFunction"]["Properties"]["Events"]["Sweep"]["Properties"]["Name"].clone();
    assert_eq!(
        resolve(&sweep, "relay-staging").as_deref(),
        Some("relay-staging-sweep"),
        "the schedule is named per stack"
    );
}

/// SES events carry recipients' addresses; alarms go the same way. Every topic the stack
/// makes is encrypted with a rotating key of its own that SES and CloudWatch may use.
#[test]
fn the_topics_are_encrypted_with_a_key_their_publishers_may_use() {
    let t = template();
    let res = t["Resources"].as_object().unwrap();
    let topics: Vec<_> = res.iter().filter(|(_, r)| r["Type"] == "AWS::SNS::Topic").collect();
    assert_eq!(topics.len(), 2);
    for (name, topic) in topics {
        let key = target(&topic["Properties"]["KmsMasterKeyId"]);
        let k = &res[&key]["Properties"];
        assert_eq!(res[&key]["Type"], "AWS::KMS::Key", "{name}");
        assert_eq!(k["EnableKeyRotation"], true);
        let text = k["KeyPolicy"].to_string();
        for publisher in ["ses.amazonaws.com", "cloudwatch.amazonaws.com", "sns.amazonaws.com"] {
            assert!(text.contains(publisher), "{publisher} may use {key}");
        }
    }
}

/// The dashboard's body is the JSON CloudWatch takes once CloudFormation substitutes it, and
/// every metric of Relay's namespace on it is one the code prints (a metric name in
/// `shared/core/src`), so a renamed metric cannot leave an empty graph behind.
#[test]
fn the_dashboard_shows_metrics_the_code_prints() {
    let t = template();
    let d = &t["Resources"]["Dashboard"];
    assert_eq!(d["Type"], "AWS::CloudWatch::Dashboard");
    let text = d["Properties"]["DashboardBody"]["Fn::Sub"].as_str().expect("a !Sub body");
    let mut resolved = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        resolved.push_str(&rest[..at]);
        let end = at + rest[at..].find('}').unwrap();
        resolved.push('x');
        rest = &rest[end + 1..];
    }
    resolved.push_str(rest);
    let body: Value = serde_json::from_str(&resolved).expect("the body is JSON");
    let widgets = body["widgets"].as_array().unwrap();
    assert!(widgets.len() >= 8, "{}", widgets.len());
    let mut source = String::new();
    let mut stack = vec![std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../core/src"))];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                source.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
    }
    let mut namespace = "";
    let mut ours = 0;
    for w in widgets {
        for m in w["properties"]["metrics"].as_array().unwrap() {
            let m = m.as_array().unwrap();
            let ns = m[0].as_str().unwrap();
            if ns != "." && ns != "..." {
                namespace = ns;
            }
            if namespace == "Relay/x" {
                let name = m[1].as_str().unwrap();
                assert!(source.contains(&format!("\"{name}\"")), "the code prints {name}");
                ours += 1;
            }
        }
    }
    assert!(ours >= 20, "{ours}");
}
