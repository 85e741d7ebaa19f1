//! The catalogue: the one registry of task types (each implements `crate::task::Task`).
//! Intake refuses a type that is not here (422, listing what is); the executor fails a job of
//! an unknown type for good.
//!
//! A task declares its parameters as a Rust type, which publishes the JSON Schema (self-
//! contained: nested types under `$defs`). Intake checks parameters against that very schema
//! (one validator, compiled once per task), then parses them into the type (serde, unknown
//! fields refused) and runs the task's own checks; each failure names the field.

mod basic;
pub mod housekeeping;
#[cfg(feature = "testing")]
mod testing;

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;
use utoipa::ToSchema;

use crate::job::{ClaimedJob, Ending, Fault, TaskError};
use crate::retry::RetryPolicy;
use crate::task::{Admission, Task, TaskContext};

pub use basic::Noop;

/// A parameter that failed validation, with the path of the field (from `params`).
pub use crate::plain::ParamError;

/// A catalogue entry as `GET /v1/tasks` shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct TaskInfo {
    pub name: &'static str,
    pub description: &'static str,
    /// JSON Schema of the task's `params`.
    pub params_schema: Value,
}

trait ErasedTask: Send + Sync {
    fn info(&self) -> TaskInfo;
    fn platform_only(&self) -> bool;
    fn fault(&self, job: &ClaimedJob, end: Ending<'_>) -> Fault;
    fn retry(&self) -> Option<RetryPolicy>;
    fn document_rules(&self, schema: &mut Value);
    fn check(&self, params: &Value) -> Result<(), ParamError>;
    fn admit(&self, params: &Value) -> Admission;
    fn needs_seconds(&self, params: &Value) -> Option<i32>;
    fn run<'a>(&'a self, ctx: &'a TaskContext, params: Value) -> BoxFuture<'a, Result<Value, TaskError>>;
}

/// The JSON Schema of a parameter type, self-contained: the types it names are put under
/// `$defs` and referred to there (utoipa refers to `#/components/schemas/`).
fn params_schema<P: ToSchema>() -> Value {
    fn point_at_defs(v: &mut Value) {
        match v {
            Value::Object(map) => {
                if let Some(Value::String(r)) = map.get_mut("$ref")
                    && let Some(name) = r.strip_prefix("#/components/schemas/")
                {
                    *r = format!("#/$defs/{name}");
                }
                map.values_mut().for_each(point_at_defs);
            }
            Value::Array(items) => items.iter_mut().for_each(point_at_defs),
            _ => {}
        }
    }
    let mut named = Vec::new();
    P::schemas(&mut named);
    let mut root = serde_json::to_value(P::schema()).unwrap_or(Value::Null);
    if let Value::Object(map) = &mut root
        && !named.is_empty()
    {
        let defs = named.into_iter().map(|(name, s)| (name, serde_json::to_value(s).unwrap_or(Value::Null))).collect();
        map.insert("$defs".into(), Value::Object(defs));
    }
    point_at_defs(&mut root);
    root
}

/// The first way `params` breaks `schema`, with the field's path.
fn against_schema(schema: &jsonschema::Validator, params: &Value) -> Result<(), ParamError> {
    match schema.iter_errors(params).next() {
        None => Ok(()),
        Some(e) => {
            let e = most_specific(&e);
            let path = e.instance_path().to_string();
            let field = match path.trim_start_matches('/') {
                "" => "params".to_owned(),
                p => format!("params.{}", p.replace('/', ".")),
            };
            Err(ParamError::new(field, e.to_string()))
        }
    }
}

/// For a value no branch of a `oneOf`/`anyOf` takes (an optional object is `oneOf` null or the
/// object), the branch's error deepest in the value: `list_unsubscribe.url` breaking its pattern
/// is reported there, not as `list_unsubscribe` matching none of its schemas.
fn most_specific<'e, 'a>(e: &'e jsonschema::ValidationError<'a>) -> &'e jsonschema::ValidationError<'a> {
    use jsonschema::error::ValidationErrorKind as Kind;
    let (Kind::OneOfNotValid { context } | Kind::AnyOf { context }) = e.kind() else { return e };
    let depth = |x: &jsonschema::ValidationError<'_>| x.instance_path().to_string().len();
    context.iter().flatten().map(most_specific).max_by_key(|x| depth(x)).filter(|x| depth(x) > depth(e)).unwrap_or(e)
}

fn parse<T: Task>(params: &Value) -> Result<T::Params, ParamError> {
    let parsed: T::Params = serde_path_to_error::deserialize(params)
        .map_err(|e| crate::plain::field_error(e.path(), e.inner()).under("params"))?;
    T::check(&parsed).map_err(|e| e.under("params"))?;
    Ok(parsed)
}

/// A task as the catalogue holds it: with its published parameter schema (the type's, with the
/// task's own rules), compiled once.
struct Registered<T> {
    task: T,
    published: Value,
    schema: jsonschema::Validator,
}

/// The schema a task publishes: its parameter type's, with what its `check` adds.
fn published_schema<T: Task>() -> Value {
    let mut schema = params_schema::<T::Params>();
    T::schema_rules(&mut schema);
    schema
}

impl<T: Task> ErasedTask for Registered<T> {
    fn info(&self) -> TaskInfo {
        TaskInfo { name: T::NAME, description: T::DESCRIPTION, params_schema: self.published.clone() }
    }

    fn platform_only(&self) -> bool {
        T::PLATFORM_ONLY
    }

    fn fault(&self, job: &ClaimedJob, end: Ending<'_>) -> Fault {
        parse::<T>(&job.params).map_or(Fault::Platform, |p| T::fault(job, end, &p))
    }

    fn retry(&self) -> Option<RetryPolicy> {
        T::RETRY
    }

    fn document_rules(&self, schema: &mut Value) {
        T::document_rules(schema);
    }

    /// The published schema first (what a client reads), then the type and the task's checks.
    fn check(&self, params: &Value) -> Result<(), ParamError> {
        against_schema(&self.schema, params)?;
        parse::<T>(params).map(|_| ())
    }

    fn admit(&self, params: &Value) -> Admission {
        parse::<T>(params).map_or_else(|_| Admission::default(), |p| T::admit(&p))
    }

    fn needs_seconds(&self, params: &Value) -> Option<i32> {
        parse::<T>(params).ok().and_then(|p| T::needs_seconds(&p))
    }

    fn run<'a>(&'a self, ctx: &'a TaskContext, params: Value) -> BoxFuture<'a, Result<Value, TaskError>> {
        Box::pin(async move {
            // Parameters were checked at intake; a failure here means the task changed shape
            // since, and another attempt would fail the same way.
            let params = parse::<T>(&params).map_err(|e| TaskError::Fatal(format!("invalid params: {e}")))?;
            T::run(&self.task, ctx, params).await
        })
    }
}

/// The registry of task types, by name. Cheap to clone: every API request's state holds it.
#[derive(Clone)]
pub struct Catalogue {
    tasks: Arc<BTreeMap<&'static str, Arc<dyn ErasedTask>>>,
}

impl Catalogue {
    /// The production catalogue.
    pub fn standard() -> Self {
        let mut c = Catalogue { tasks: Arc::default() };
        c.add(basic::Noop);
        c.add(basic::Sleep);
        c.add(crate::email::task::SendEmail);
        c.add(crate::email::task::SendCampaign);
        c.add(crate::provider::ProviderEvent);
        c.add(housekeeping::Retention);
        c.add(crate::callbacks::task::Deliver::default());
        c.add(crate::destinations::task::HttpRequest::default());
        c.add(crate::destinations::webhook::WebhookSend::default());
        c
    }

    /// With the `test.*` tasks, which force failures and count effects: only in builds with the
    /// `testing` feature (the tests, the chaos suite, `relay dev --test-tasks`), never in a
    /// Lambda function.
    #[cfg(feature = "testing")]
    pub fn with_test_tasks(mut self) -> Self {
        self.add(testing::Fail);
        self.add(testing::Effect);
        self.add(testing::WhoAmI);
        self.add(testing::Await);
        self
    }

    fn add<T: Task>(&mut self, task: T) {
        // A schema that does not compile is a bug in a parameter type, found by the first test
        // that builds the catalogue.
        let published = published_schema::<T>();
        let schema = jsonschema::validator_for(&published)
            .unwrap_or_else(|e| panic!("the parameter schema of {} does not compile: {e}", T::NAME));
        Arc::make_mut(&mut self.tasks).insert(T::NAME, Arc::new(Registered { task, published, schema }));
    }

    /// Replace (or add) a task, e.g. one configured at start-up.
    pub fn with<T: Task>(mut self, task: T) -> Self {
        self.add(task);
        self
    }

    /// A task type's own retry schedule, if it has one.
    pub fn retry_policy(&self, name: &str) -> Option<RetryPolicy> {
        self.tasks.get(name).and_then(|t| t.retry())
    }

    /// Whose failure it is when `job` ends for good as `end` says, as its task type judges
    /// (the platform's for a type not in the catalogue, or parameters that no longer parse).
    pub fn fault(&self, job: &ClaimedJob, end: Ending<'_>) -> Fault {
        self.tasks.get(job.task_type.as_str()).map_or(Fault::Platform, |t| t.fault(job, end))
    }

    /// Every task type, platform ones included.
    pub fn names(&self) -> Vec<&'static str> {
        self.tasks.keys().copied().collect()
    }

    /// The task types a client may submit.
    pub fn client_names(&self) -> Vec<&'static str> {
        self.tasks.iter().filter(|(_, t)| !t.platform_only()).map(|(n, _)| *n).collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tasks.contains_key(name)
    }

    /// Whether a client may submit this task type.
    pub fn client_may_submit(&self, name: &str) -> bool {
        self.tasks.get(name).is_some_and(|t| !t.platform_only())
    }

    /// The tasks a client may submit, as `GET /v1/tasks` shows them.
    pub fn describe(&self) -> Vec<TaskInfo> {
        self.tasks.values().filter(|t| !t.platform_only()).map(|t| t.info()).collect()
    }

    /// Every task, platform-only ones included (what a schedule may fire).
    pub fn describe_all(&self) -> Vec<TaskInfo> {
        self.tasks.values().map(|t| t.info()).collect()
    }

    /// Narrow a task type's published schema for the OpenAPI document (`Task::document_rules`):
    /// the rules the document adds come from the task, as its published ones do.
    pub fn document_rules(&self, name: &str, schema: &mut Value) {
        if let Some(t) = self.tasks.get(name) {
            t.document_rules(schema);
        }
    }

    /// Validate parameters for a task type known to be in the catalogue.
    pub fn check(&self, name: &str, params: &Value) -> Result<(), ParamError> {
        match self.tasks.get(name) {
            Some(t) => t.check(params),
            None => Err(ParamError::new("task_type", format!("unknown task type {name:?}"))),
        }
    }

    /// What intake settles for a job of this type and these (valid) parameters; each named
    /// field as a `params.` path.
    pub fn admit(&self, name: &str, params: &Value) -> Admission {
        let mut admission = self.tasks.get(name).map(|t| t.admit(params)).unwrap_or_default();
        for n in &mut admission.names {
            n.field = format!("params.{}", n.field);
        }
        admission
    }

    /// The least `timeout_seconds` a job of this type and these (valid) parameters needs.
    pub fn needs_seconds(&self, name: &str, params: &Value) -> Option<i32> {
        self.tasks.get(name).and_then(|t| t.needs_seconds(params))
    }

    /// Run a task; `None` when the type is not in the catalogue.
    pub async fn run(&self, name: &str, ctx: &TaskContext, params: Value) -> Option<Result<Value, TaskError>> {
        let task = self.tasks.get(name)?.clone();
        Some(task.run(ctx, params).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    use crate::task::TaskContext;

    #[test]
    fn test_tasks_exist_only_when_asked_for() {
        assert_eq!(
            Catalogue::standard().names(),
            [
                "callback.deliver",
                "email.campaign",
                "email.send",
                "http.request",
                "noop",
                "provider.event",
                "relay.retention",
                "sleep",
                "webhook.send"
            ]
        );
        assert_eq!(
            Catalogue::standard().client_names(),
            ["email.campaign", "email.send", "http.request", "noop", "sleep", "webhook.send"]
        );
        #[cfg(feature = "testing")]
        assert!(Catalogue::standard().with_test_tasks().contains("test.fail"));
        assert!(!Catalogue::standard().contains("test.fail"));
    }

    #[test]
    fn params_are_checked_and_the_failing_field_named() {
        let c = Catalogue::standard();
        assert!(c.check("sleep", &json!({"seconds": 1.5})).is_ok());
        let e = c.check("sleep", &json!({"seconds": "soon"})).unwrap_err();
        assert_eq!(e.field, "params.seconds");
        let e = c.check("sleep", &json!({"seconds": -1})).unwrap_err();
        assert_eq!(e.field, "params.seconds");
        let e = c.check("noop", &json!({"surprise": 1})).unwrap_err();
        assert!(e.message.contains("'surprise' was unexpected"), "{e}");
        let e = c.check("sleep", &json!({})).unwrap_err();
        assert!(e.message.contains("\"seconds\" is a required property"), "{e}");
        assert!(!e.message.contains("f64"), "no Rust type names in what a client reads: {e}");
    }

    #[derive(serde::Deserialize, ToSchema)]
    #[serde(deny_unknown_fields)]
    struct LimitedParams {
        #[allow(dead_code)]
        tags: Vec<String>,
    }

    /// A task whose one rule, at most `N` tags, is written once: in its `schema_rules`.
    struct Limited<const N: usize>;

    impl<const N: usize> Task for Limited<N> {
        type Params = LimitedParams;
        const NAME: &'static str = "test.limited";
        const DESCRIPTION: &'static str = "a rule written once";

        fn schema_rules(schema: &mut Value) {
            schema["properties"]["tags"]["maxItems"] = json!(N);
        }

        async fn run(&self, _ctx: &TaskContext, _params: LimitedParams) -> Result<Value, TaskError> {
            Ok(Value::Null)
        }
    }

    /// Changing the rule in its one place changes both what `GET /v1/tasks` publishes and what
    /// intake refuses.
    #[test]
    fn a_rule_written_on_the_task_is_published_and_held_at_intake_alike() {
        fn follows<const N: usize>() {
            let c = Catalogue::standard().with(Limited::<N>);
            let info = c.describe().into_iter().find(|t| t.name == "test.limited").unwrap();
            assert_eq!(info.params_schema["properties"]["tags"]["maxItems"], json!(N));
            let tags = |n: usize| json!({"tags": vec!["t"; n]});
            assert!(c.check("test.limited", &tags(N)).is_ok());
            assert_eq!(c.check("test.limited", &tags(N + 1)).unwrap_err().field, "params.tags");
        }
        follows::<2>();
        follows::<3>();
    }

    #[test]
    fn the_email_tasks_publish_what_their_checks_refuse() {
        let c = Catalogue::standard();
        let send = c.describe().into_iter().find(|t| t.name == "email.send").unwrap().params_schema;
        assert_eq!(send["properties"]["to"]["items"]["format"], "email");
        assert_eq!(send["properties"]["to"]["maxItems"], json!(crate::email::content::MAX_RECIPIENTS));
        assert_eq!(send["properties"]["template"]["pattern"], crate::store::templates::NAME_PATTERN);
        let base = json!({"from": "a@b.example", "subject": "s", "text": "t"});
        let with = |k: &str, v: Value| {
            let mut p = base.clone();
            p[k] = v;
            p
        };
        let fifty_one: Vec<String> = (0..51).map(|i| format!("r{i}@b.example")).collect();
        assert_eq!(c.check("email.send", &with("to", json!(fifty_one))).unwrap_err().field, "params.to");
        assert_eq!(c.check("email.send", &base).unwrap_err().field, "params", "no recipient");
        // A display name is taken: `format: email` is the client's assertion (an `@`), not the server's.
        let mut named = with("from", json!("Acme <a@b.example>"));
        named["to"] = json!(["x@b.example"]);
        assert!(c.check("email.send", &named).is_ok());
        let campaign = c.describe().into_iter().find(|t| t.name == "email.campaign").unwrap().params_schema;
        assert_eq!(campaign["$defs"]["SendParams"]["properties"]["to"]["maxItems"], json!(0));
        assert_eq!(campaign["$defs"]["Recipient"]["properties"]["to"]["format"], "email");
    }

    #[test]
    fn every_task_publishes_an_object_schema() {
        for t in Catalogue::standard().describe() {
            assert_eq!(t.params_schema["type"], "object", "{}", t.name);
        }
    }

    #[test]
    fn published_schemas_stand_alone_and_intake_holds_params_to_them() {
        let c = Catalogue::standard();
        for t in c.describe() {
            let text = t.params_schema.to_string();
            assert!(!text.contains("#/components/"), "{} refers outside itself: {text}", t.name);
        }
        let campaign = c.describe().into_iter().find(|t| t.name == "email.campaign").unwrap();
        assert!(campaign.params_schema["$defs"]["SendParams"].is_object(), "{}", campaign.params_schema);
        // What serde alone let through: a struct's fields given as an array.
        let e = c.check("noop", &json!([1])).unwrap_err();
        assert_eq!(e.field, "params", "{e}");
        let e = c.check("sleep", &json!({"seconds": [1]})).unwrap_err();
        assert_eq!(e.field, "params.seconds", "{e}");
        let e = c
            .check(
                "email.campaign",
                &json!({"message": {"from": "a@b.example", "subject": "s", "text": "t"},
            "recipients": [{"to": 5}]}),
            )
            .unwrap_err();
        assert_eq!(e.field, "params.recipients.0.to", "{e}");
    }
}
