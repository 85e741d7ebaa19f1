//! The SAM template's alarms and deployments: what pages, and every function shipped through
//! an alias the pre-traffic hook gates and the alarms roll back.

use std::collections::BTreeSet;

use serde_json::{Value, json};

use crate::template::*;

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
