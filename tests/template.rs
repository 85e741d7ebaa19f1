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

pub(crate) fn to_json(v: serde_yaml_ng::Value) -> Value {
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

pub(crate) fn num(v: &Value) -> i64 {
    v.as_i64().or_else(|| v.as_str().and_then(|s| s.parse().ok())).unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The logical id a `!GetAtt X.Arn` / `!Ref X` names (a `!Sub`: its text, a literal: itself).
pub(crate) fn target(v: &Value) -> String {
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

pub(crate) fn functions(t: &Value) -> BTreeMap<String, Value> {
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
pub(crate) fn role_actions(t: &Value, role: &str) -> BTreeSet<String> {
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
pub(crate) fn task_roles(t: &Value) -> BTreeMap<String, Value> {
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
pub(crate) fn config_of(t: &Value, function: &str) -> taskdeck::config::LambdaConfig {
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

/// Every logical id a `Ref`, `GetAtt` or `Sub` under `v` names.
pub(crate) fn refs(v: &Value) -> Vec<String> {
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
pub(crate) fn resolved_database_url(p: &Value) -> String {
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
