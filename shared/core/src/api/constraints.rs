//! What the server enforces beyond the handlers' annotations, written into the OpenAPI document
//! (`openapi::document`) so that every request the document allows is one the server takes:
//! each task type with its own `params` (the schema `GET /v1/tasks` publishes and intake checks,
//! narrowed by the task's own `Task::document_rules`: this module names no task type),
//! fields given together or not at all, text patterns, cursors, time zones, cron expressions.
//! Where the server's rule is wider than a pattern can say (an email address, a URL, a cron
//! expression), the pattern states a part of it the server always takes.

use serde_json::{Map, Value, json};

use crate::catalogue::housekeeping::RETENTION;
use crate::catalogue::{Catalogue, TaskInfo};
use crate::email::document::ADDRESS;
use crate::pattern::NO_NUL;
use crate::pattern::{NON_BLANK, PRINTABLE};

/// Template text without template syntax it could fail to compile (`{{`, `{%`, `{#`).
pub const PLAIN_TEMPLATE_TEXT: &str = "^([^\\x00{]|\\{[^\\x00{%#])*\\{?$";
/// Template and schedule names (`templates::check_name`; schedules also take `:`).
pub const TEMPLATE_NAME: &str = crate::store::templates::NAME_PATTERN;
pub const SCHEDULE_NAME: &str = "^[A-Za-z0-9_.:-]{1,100}$";
/// An IAM role ARN (`credentials::valid_role_arn`).
pub const ROLE_ARN: &str = "^arn:aws[^:\\x00]*:iam::[0-9]{12}:role/[^\\x00]*[^/\\x00]$";

/// Five cron fields (minute, hour, day of month, month, day of week), each `*`, `*/step` or a
/// list of values; days of the month 1 to 28, so every expression has a next slot.
pub fn cron_pattern() -> String {
    let field = |v: &str| format!("(\\*(/[1-9])?|({v})(,({v}))*)");
    let fields = ["[1-5]?[0-9]", "1?[0-9]|2[0-3]", "[1-9]|1[0-9]|2[0-8]", "[1-9]|1[0-2]", "[0-6]"].map(field);
    format!("^{}$", fields.join(" "))
}

/// Write the constraints into `doc` (before its strings get the NUL-free pattern).
pub fn apply(doc: &mut Value) {
    let catalogue = Catalogue::standard();
    let schemas = &mut doc["components"]["schemas"];
    schemas["Json"] = json_value();
    let tasks = task_schemas(&catalogue, schemas);
    let callback_url = crate::outbound::url_pattern(false);
    job_rules(schemas, tasks.client, tasks.client_branches, &callback_url);
    schedule_rules(schemas, tasks.all, tasks.all_branches);
    operator_rules(schemas, &catalogue);
    settings_rules(schemas, &callback_url);
    path_rules(doc);
}

/// The task types' names and `params` branches: those a client may submit, and those a
/// schedule may name.
struct TaskBranches {
    client: Vec<Value>,
    client_branches: Vec<Value>,
    all: Vec<Value>,
    all_branches: Vec<Value>,
}

/// Each task's params schema, narrowed by the task's own document rules (`Task::document_rules`),
/// and the campaign pages' shapes.
fn task_schemas(catalogue: &Catalogue, schemas: &mut Value) -> TaskBranches {
    let mut defs = Map::new();
    let branches = |tasks: Vec<TaskInfo>, defs: &mut Map<String, Value>| -> (Vec<Value>, Vec<Value>) {
        let names = tasks.iter().map(|t| json!(t.name)).collect();
        let branches = tasks.into_iter().map(|t| branch(catalogue, t, defs)).collect();
        (names, branches)
    };
    let (client, client_branches) = branches(catalogue.describe(), &mut defs);
    let scheduled = catalogue
        .describe_all()
        .into_iter()
        .filter(|t| catalogue.client_may_submit(t.name) || t.name == RETENTION)
        .collect();
    let (all, all_branches) = branches(scheduled, &mut defs);
    for (name, schema) in defs {
        schemas[name] = schema;
    }
    crate::email::document::recipient(&mut schemas["Recipient"]);
    crate::email::document::recipient_page(&mut schemas["RecipientPage"]);
    TaskBranches { client, client_branches, all, all_branches }
}

/// A job request: its task type and params branch, fields given together, the callback URL.
fn job_rules(schemas: &mut Value, client: Vec<Value>, client_branches: Vec<Value>, callback_url: &str) {
    let job = &mut schemas["JobRequest"];
    job["properties"]["task_type"] =
        json!({"type": "string", "enum": client, "description": "A task type from `GET /v1/tasks`."});
    job["properties"]["params"] =
        json!({"description": "Parameters, checked against the task's schema (`GET /v1/tasks`)."});
    for field in ["correlation_id", "concurrency_key", "ordering_key"] {
        job["properties"][field]["pattern"] = json!(PRINTABLE);
    }
    job["properties"]["callback_url"]["pattern"] = json!(callback_url);
    job["properties"]["callback_url"]["maxLength"] = json!(crate::outbound::MAX_URL_LEN);
    job["oneOf"] = json!(client_branches);
    job["allOf"] = json!([
        {"anyOf": [{"properties": {"run_at": {"type": "null"}}}, {"properties": {"delay_seconds": {"type": "null"}}}]},
        {"anyOf": [{"properties": {"ordering_on_failure": {"type": "null"}}},
                   {"required": ["ordering_key"], "properties": {"ordering_key": {"type": "string"}}}]},
        {"anyOf": [
            {"required": ["concurrency_key", "concurrency_limit"],
             "properties": {"concurrency_key": {"type": "string"}, "concurrency_limit": {"type": "integer"}}},
            {"properties": {"concurrency_key": {"type": "null"}, "concurrency_limit": {"type": "null"}}},
        ]},
    ]);
    schemas["BatchRequest"]["properties"]["jobs"]["items"] = json!({"$ref": "#/components/schemas/Json"});
}

/// A schedule: its name, task type and params branch, cron expression and time zone.
fn schedule_rules(schemas: &mut Value, all: Vec<Value>, all_branches: Vec<Value>) {
    let spec = &mut schemas["ScheduleSpec"];
    spec["properties"]["name"]["pattern"] = json!(SCHEDULE_NAME);
    spec["properties"]["task_type"] = json!({"type": "string", "enum": all});
    spec["properties"]["params"] = json!({"description": "Parameters, checked against the task's schema."});
    spec["oneOf"] = json!(all_branches);
    for name in ["ScheduleSpec", "SchedulePatch"] {
        let s = &mut schemas[name];
        s["properties"]["cron"]["pattern"] = json!(cron_pattern());
        s["properties"]["cron"]["description"] = json!(
            "Five fields, minute first. The pattern states expressions always taken \
            (every one has a next slot); the server also takes ranges, names, a seconds field and any expression with a next slot."
        );
        s["properties"]["timezone"]["enum"] = json!(time_zones(s["properties"]["timezone"]["type"].is_array()));
    }
    schemas["SchedulePatch"]["properties"]["params"] = json!({"$ref": "#/components/schemas/Json",
        "description": "Parameters of the schedule's own task type; params it would refuse answer 409."});
}

/// The operator's bodies: mode names, bulk actions, finishes and completions.
fn operator_rules(schemas: &mut Value, catalogue: &Catalogue) {
    let integrations = format!("({})", crate::store::modes::INTEGRATIONS.join("|"));
    let paused = catalogue.names().iter().map(|n| n.replace('.', "\\.")).collect::<Vec<_>>().join("|");
    schemas["ModeChange"]["properties"]["name"]["pattern"] = json!(format!(
        "^(shadow|write:{integrations}|write:http:{uuid}:{dest}|pause:({paused}))$",
        uuid = "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        dest = crate::destinations::NAME_PATTERN.trim_start_matches('^').trim_end_matches('$'),
    ));

    let bulk = &mut schemas["BulkBody"];
    bulk["oneOf"] = json!([
        {"properties": {"action": {"enum": ["retry", "cancel"]}}},
        {"properties": {"action": {"enum": ["finish", "ignore"]}, "reason": {"type": "string", "pattern": NON_BLANK}}, "required": ["reason"]},
    ]);
    schemas["FinishBody"]["properties"]["result"] = json!({"$ref": "#/components/schemas/Json"});
    // A completion's result goes with success only, its error and retryable with failure only.
    schemas["CompletionRequest"]["oneOf"] = json!([
        {"properties": {"outcome": {"const": "success"}, "error": {"type": "null"}, "retryable": {"type": "null"}}},
        {"properties": {"outcome": {"const": "failure"}, "result": {"type": "null"}}},
    ]);
    schemas["Resume"]["properties"]["reason"]["pattern"] = json!(NON_BLANK);
    schemas["GuardChange"]["properties"]["exempt_tags"]["items"] =
        json!({"type": "string", "pattern": "^[ -<>-~]{1,150}=[ -~]{0,149}$"});
}

/// A tenant's settings: templates, callbacks, destinations and its sending role.
fn settings_rules(schemas: &mut Value, callback_url: &str) {
    let template = &mut schemas["TemplateBody"];
    let syntax = "Template syntax (`{{ }}`, `{% %}`, `{# #}`) is taken when it compiles (else 422 `template_syntax`); \
        the pattern states the text that always does.";
    template["properties"]["subject"] = json!({"type": "string", "allOf": [{"pattern": NON_BLANK}, {"pattern": PLAIN_TEMPLATE_TEXT}],
        "description": format!("Not blank. {syntax}")});
    for part in ["text", "html"] {
        template["properties"][part]["pattern"] = json!(PLAIN_TEMPLATE_TEXT);
        template["properties"][part]["description"] = json!(syntax);
    }
    template["anyOf"] = json!([
        {"required": ["text"], "properties": {"text": {"type": "string"}}},
        {"required": ["html"], "properties": {"html": {"type": "string"}}},
    ]);
    schemas["CallbackSettingsRequest"]["properties"]["url"]["pattern"] = json!(callback_url);
    schemas["CallbackSettingsRequest"]["properties"]["message_events"]["items"] =
        json!({"type": "string", "enum": crate::store::message_events::WEBHOOK_TYPES});
    schemas["CallbackSettingsRequest"]["properties"]["message_events"]["maxItems"] =
        json!(crate::store::message_events::WEBHOOK_TYPES.len());
    // A destination's base URL: a callback URL's shape, https, no query (http only for hosts
    // on the operator's allow-list, which the document cannot know).
    let base_url = callback_url.replacen("^https?://", "^https://", 1);
    let base_url = format!("{}$", &base_url[..base_url.rfind("(\\?(").unwrap_or(base_url.len() - 1)]);
    schemas["DestinationBody"]["properties"]["base_url"]["pattern"] = json!(base_url);
    schemas["DestinationBody"]["properties"]["base_url"]["maxLength"] = json!(crate::outbound::MAX_URL_LEN);
    super::destinations::schema_rules(schemas, &base_url);
    schemas["DestinationBody"]["properties"]["url_patterns"]["items"] = json!({"type": "string",
        "maxLength": crate::destinations::patterns::MAX_PATTERN_LEN, "pattern": crate::destinations::patterns::SHAPE});
    schemas["SendingRoleBody"]["properties"]["role_arn"]["pattern"] = json!(ROLE_ARN);
}

/// Path and query parameters the handlers take as plain strings.
fn path_rules(doc: &mut Value) {
    // The feeds' `updated_since`: an RFC 3339 time or a cursor the API issued.
    let since = json!({"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "pattern": super::cursor::PATTERN}]});
    let topic = json!({"type": "string", "pattern": crate::store::topics::NAME_PATTERN});
    for (path, method, param, schema) in [
        ("/v1/jobs", "get", "updated_since", since.clone()),
        ("/v1/messages/events", "get", "updated_since", since),
        ("/v1/suppressions/{address}", "put", "address", json!({"type": "string", "pattern": ADDRESS})),
        ("/v1/templates/{name}", "put", "name", json!({"type": "string", "pattern": TEMPLATE_NAME})),
        ("/v1/topic-opt-outs", "get", "address", json!({"type": "string", "pattern": ADDRESS})),
        ("/v1/topic-opt-outs/{address}/{topic}", "put", "address", json!({"type": "string", "pattern": ADDRESS})),
        ("/v1/topic-opt-outs/{address}/{topic}", "delete", "address", json!({"type": "string", "pattern": ADDRESS})),
        ("/v1/topic-opt-outs/{address}/{topic}", "put", "topic", topic.clone()),
        ("/v1/topic-opt-outs/{address}/{topic}", "delete", "topic", topic.clone()),
        ("/v1/topics/{topic}/ses", "put", "topic", topic.clone()),
        ("/v1/topics/{topic}/ses", "delete", "topic", topic),
        (
            "/v1/destinations/{name}",
            "put",
            "name",
            json!({"type": "string", "pattern": crate::destinations::NAME_PATTERN}),
        ),
    ] {
        if let Some(p) =
            doc["paths"][path][method]["parameters"].as_array_mut().into_iter().flatten().find(|p| p["name"] == param)
        {
            p["schema"] = schema;
        }
    }
}

/// Any JSON value without a NUL character in a string or a member name.
fn json_value() -> Value {
    let me = json!({"$ref": "#/components/schemas/Json"});
    json!({"description": "Any JSON value without a NUL character.", "anyOf": [
        {"type": ["null", "boolean", "number"]},
        {"type": "string", "pattern": NO_NUL},
        {"type": "array", "items": me},
        {"type": "object", "propertyNames": {"pattern": NO_NUL}, "additionalProperties": me},
    ]})
}

/// One task's branch of a request: its `task_type` and its own `params` schema (required when
/// the task requires any member) with the task's document rules, its `$defs` moved to
/// components under a prefix.
fn branch(catalogue: &Catalogue, t: TaskInfo, defs: &mut Map<String, Value>) -> Value {
    let prefix = format!("Params_{}_", t.name.replace('.', "_"));
    let mut schema = t.params_schema;
    let own = schema.as_object_mut().and_then(|o| o.remove("$defs"));
    rewrite(&mut schema, &prefix);
    if let Some(Value::Object(mut own)) = own {
        own.values_mut().for_each(|def| rewrite(def, &prefix));
        schema["$defs"] = Value::Object(own);
    }
    catalogue.document_rules(t.name, &mut schema);
    if let Some(Value::Object(own)) = schema.as_object_mut().and_then(|o| o.remove("$defs")) {
        defs.extend(own.into_iter().map(|(name, def)| (format!("{prefix}{name}"), def)));
    }
    let needs_params = schema["required"].as_array().is_some_and(|r| !r.is_empty());
    let mut b = json!({"properties": {"task_type": {"const": t.name}, "params": schema}});
    if needs_params {
        b["required"] = json!(["params"]);
    }
    b
}

/// Point `#/$defs/X` at the component `<prefix>X`; give any-value members the NUL-free `Json`
/// and member names the NUL-free pattern.
fn rewrite(v: &mut Value, prefix: &str) {
    match v {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get_mut("$ref")
                && let Some(name) = r.strip_prefix("#/$defs/")
            {
                *r = format!("#/components/schemas/{prefix}{name}");
            }
            if let Some(names) = map.get_mut("propertyNames").and_then(Value::as_object_mut) {
                names.entry("pattern").or_insert_with(|| json!(NO_NUL));
            }
            for (key, member) in map.iter_mut() {
                let nested = matches!(key.as_str(), "properties" | "$defs");
                if nested {
                    for m in member.as_object_mut().into_iter().flat_map(|o| o.values_mut()) {
                        any_to_json(m);
                        rewrite(m, prefix);
                    }
                } else if matches!(key.as_str(), "additionalProperties" | "items") {
                    any_to_json(member);
                    rewrite(member, prefix);
                } else {
                    rewrite(member, prefix);
                }
            }
        }
        Value::Array(items) => items.iter_mut().for_each(|x| rewrite(x, prefix)),
        _ => {}
    }
}

/// In a request schema: any-value members take the NUL-free `Json`, member names the NUL-free
/// pattern (the server refuses a NUL anywhere in a body).
pub fn any_is_json(v: &mut Value) {
    rewrite(v, "");
}

/// A schema that allows any value (no type, reference or combinator) becomes the `Json` one.
fn any_to_json(v: &mut Value) {
    let Some(map) = v.as_object_mut() else { return };
    let open = ["type", "$ref", "anyOf", "oneOf", "allOf", "enum", "const"].iter().all(|k| !map.contains_key(*k));
    if open {
        map.insert("$ref".into(), json!("#/components/schemas/Json"));
    }
}

/// The IANA names the server takes (`chrono_tz`), with null when the field may be null.
fn time_zones(nullable: bool) -> Vec<Value> {
    let mut names: Vec<Value> = chrono_tz::TZ_VARIANTS.iter().map(|tz| json!(tz.name())).collect();
    if nullable {
        names.push(Value::Null);
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cron_pattern_holds_only_expressions_the_server_takes() {
        let re = cron_pattern();
        assert!(re.starts_with("^(\\*(/[1-9])?|"));
        for e in ["* * * * *", "*/5 0,12 1,28 */2 0,6", "59 23 28 12 6"] {
            crate::schedules::CronTz::parse(e, "UTC").unwrap_or_else(|e| panic!("{e:?}"));
        }
    }

    #[test]
    fn cursor_parameters_state_the_cursor_shape() {
        let doc = super::super::openapi::document();
        for path in ["/v1/jobs", "/v1/admin/exceptions"] {
            let params = doc["paths"][path]["get"]["parameters"].as_array().unwrap();
            let cursor = params.iter().find(|p| p["name"] == "cursor").unwrap();
            assert_eq!(cursor["schema"]["pattern"], super::super::cursor::PATTERN, "{path}");
        }
    }

    #[test]
    fn the_documented_callback_url_shape_is_one_the_server_takes() {
        let documented = regex::Regex::new(&crate::outbound::url_pattern(false)).unwrap();
        let allow = crate::outbound::AllowList::default();
        for url in ["https://a.example/x?y=%2F", "http://localhost:65535", "http://a-1.b/p/q;r=s@t"] {
            assert!(documented.is_match(url), "{url}");
            assert_eq!(crate::outbound::check_url(url, &allow), Ok(()), "{url}");
        }
        for url in ["http://a.example:65536/", "http://a.example/%zz", "http://10.0.0.1/"] {
            assert!(!documented.is_match(url), "{url}");
        }
    }

    /// `email.send`'s branch of the published job request.
    fn email_send_request() -> serde_json::Value {
        let doc = super::super::openapi::document();
        doc["components"]["schemas"]["JobRequest"]["oneOf"]
            .as_array()
            .unwrap()
            .iter()
            .find(|b| b["properties"]["task_type"]["const"] == "email.send")
            .unwrap()
            .clone()
    }

    #[test]
    fn the_documented_topic_names_are_those_the_server_takes() {
        let documented = regex::Regex::new(crate::store::topics::NAME_PATTERN).unwrap();
        let long = "a".repeat(64);
        let too_long = "a".repeat(65);
        for name in ["news", "A-1_b.c", long.as_str(), "", "a b", "\"", "ü", too_long.as_str(), "a/b"] {
            let takes = crate::store::topics::check_name(name).is_ok();
            assert_eq!(documented.is_match(name), takes, "{name:?}");
        }
        let doc = crate::api::openapi::document();
        let put = &doc["paths"]["/v1/topics/{topic}/ses"]["put"]["parameters"][0];
        assert_eq!(put["schema"]["pattern"], crate::store::topics::NAME_PATTERN, "{put}");
    }

    #[test]
    fn member_name_rules_survive_the_nul_free_pass() {
        let send = email_send_request();
        assert_eq!(
            send["properties"]["params"]["properties"]["headers"]["propertyNames"]["pattern"],
            "^[!-9;-~]{1,126}$"
        );
        assert_eq!(
            send["properties"]["params"]["properties"]["tags"]["propertyNames"]["pattern"],
            crate::email::content::TAG_PATTERN
        );
    }

    /// The header names `email.send`'s schema allows are the ones its check takes.
    #[test]
    fn email_header_names_are_documented_as_the_check_takes_them() {
        let send = email_send_request();
        let names = &send["properties"]["params"]["properties"]["headers"]["propertyNames"];
        let allowed = regex::Regex::new(names["pattern"].as_str().unwrap()).unwrap();
        let refused = regex::Regex::new(names["not"]["pattern"].as_str().unwrap()).unwrap();
        for n in [
            "X-Order",
            "List-Id",
            "Content-Type",
            "content-disposition",
            "MIME-Version",
            "X-SES-MESSAGE-TAGS",
            "x-ses-configuration-set",
            "X-Relay-Correlation-Id",
            "From",
            "DKIM-Signature",
            "X-Content",
            "Contents",
        ] {
            let documented = allowed.is_match(n) && !refused.is_match(n);
            assert_eq!(documented, !crate::email::content::reserved_header(n), "{n}");
        }
    }

    /// The header names `http.request`'s schema allows, in a job and a schedule, are the
    /// ones the task takes.
    #[test]
    fn http_request_header_names_are_documented_as_the_task_checks_them() {
        let doc = super::super::openapi::document();
        for schema in ["JobRequest", "ScheduleSpec"] {
            let http = doc["components"]["schemas"][schema]["oneOf"]
                .as_array()
                .unwrap()
                .iter()
                .find(|b| b["properties"]["task_type"]["const"] == "http.request")
                .unwrap()
                .clone();
            let names = &http["properties"]["params"]["properties"]["headers"]["propertyNames"];
            let allowed = regex::Regex::new(names["pattern"].as_str().unwrap()).unwrap();
            let refused = regex::Regex::new(names["not"]["pattern"].as_str().unwrap()).unwrap();
            let documented = |n: &str| allowed.is_match(n) && !refused.is_match(n);
            let mut names: Vec<String> = ["X-Tenant-Ref", "x_a.b~c", "HOST", "Content-Type", "content-LENGTH", "Te"]
                .iter()
                .chain(&["X A", "X:A", "é", "", "x\0", "X-Relay-Correlation-Id", "idempotency-KEY", "a(b)", "a/b"])
                .map(|n| (*n).to_owned())
                .collect();
            names.extend(crate::destinations::REFUSED_HEADERS.iter().map(|h| h.to_ascii_uppercase()));
            names.push("x".repeat(64));
            names.push("x".repeat(65));
            for n in names {
                let takes = crate::destinations::check_header(&n, "v", None).is_ok();
                assert_eq!(documented(&n), takes, "{schema}: {n:?}");
            }
        }
    }

    #[test]
    fn every_time_zone_named_is_one_the_server_takes() {
        for tz in time_zones(false) {
            crate::schedules::CronTz::parse("* * * * *", tz.as_str().unwrap()).unwrap();
        }
    }
}
