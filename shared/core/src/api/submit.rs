//! Submitting jobs: one (`POST /v1/jobs`) or a batch (`POST /v1/jobs:batch`), each request
//! checked into a `NewJob` (its task's parameters, the deployment's admission, what it names
//! that the tenant must have stored) and inserted through the intake.

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Caller, JsonBody};
use crate::catalogue::Catalogue;
use crate::intake::Links;
use crate::job::terms::{
    self, Concurrency, CorrelationId, IdempotencyKey, Limits, MAX_TIMEOUT_SECONDS, OnFailure, Ordering, RequestHash,
};
use crate::job::{HELD_FOR, JobId, TenantId};
use crate::outbound::AllowList;
use crate::store::jobs::{Inserted, NewJob};
use crate::store::{StoreError, dependencies};
use crate::task::{Named, Stored};
use crate::view::JobView;

pub const MAX_BATCH: usize = 500;
/// What a deployment admits beyond each task's own parameters.
#[derive(Debug, Clone)]
pub struct Admission {
    /// The operator's callback allow-list: a `callback_url` whose host is an address the guard
    /// refuses is refused at submit unless allowed here.
    pub callback_allow: AllowList,
    /// The longest `timeout_seconds` this deployment's executor can give a job.
    pub max_timeout_seconds: i32,
}

impl Default for Admission {
    fn default() -> Self {
        Admission { callback_allow: AllowList::default(), max_timeout_seconds: MAX_TIMEOUT_SECONDS }
    }
}

/// A job to submit.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct JobRequest {
    /// A task type from `GET /v1/tasks`.
    pub task_type: String,
    /// Parameters, checked against the task's schema.
    #[serde(default = "empty_object")]
    pub params: Value,
    /// Carried by every retry, child and event; minted by Relay when absent.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 200)]
    pub correlation_id: Option<String>,
    /// Run no earlier than this time (RFC 3339). Not with `delay_seconds`.
    #[serde(default)]
    pub run_at: Option<DateTime<Utc>>,
    /// Run no earlier than this many seconds from now. Not with `run_at`.
    #[serde(default)]
    #[schema(maximum = 31_622_400)]
    pub delay_seconds: Option<u32>,
    /// 1 to 100; default 5.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 100)]
    pub max_attempts: Option<i32>,
    /// Per-attempt time limit, 1 to 86400 seconds; default 300.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 86_400)]
    pub timeout_seconds: Option<i32>,
    /// No more than `concurrency_limit` jobs with this key (1 to 200 characters) run at once;
    /// jobs with other keys or none are not held back. Give both or neither.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200)]
    pub concurrency_key: Option<String>,
    /// 1 to 10000.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(minimum = 1, maximum = 10_000)]
    pub concurrency_limit: Option<i32>,
    /// Where this job's callbacks go (http or https), instead of the tenant's callback URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub callback_url: Option<String>,
    /// Up to 100 ids of this tenant's jobs that this one runs after: it stays pending
    /// (`waiting_reason` `waiting_for_dependency`, no attempt used) until every one has
    /// succeeded, and is cancelled, naming the dependency, if one ends otherwise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schema(value_type = Vec<uuid::Uuid>, max_items = 100)]
    pub after: Vec<JobId>,
    /// FIFO per key (1 to 200 characters): this tenant's jobs with one ordering key start in
    /// the order they were submitted, one at a time, each once the one ahead has succeeded
    /// (pending meanwhile, `waiting_reason` `ordered_behind`, `ordered_behind` naming it).
    /// Jobs in one batch are submitted in the batch's order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 200)]
    pub ordering_key: Option<String>,
    /// What this job's failure (for good) does to the jobs behind it on its key: `hold`
    /// (default: they wait until it is retried and succeeds or is finished by an operator; a
    /// cancel of it cancels them) or `cancel` (they are cancelled, naming it). Only with
    /// `ordering_key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ordering_on_failure: Option<OnFailure>,
}

/// `{"results": [...]}`, one per submitted item, in order.
#[derive(Debug, Serialize, ToSchema)]
pub struct BatchResults {
    pub results: Vec<BatchItemResult>,
}

fn empty_object() -> Value {
    json!({})
}

impl JobRequest {
    /// What the job is linked to: the jobs it runs after and its ordering key.
    fn links(&self) -> Result<Links, ApiError> {
        let ordering = Ordering::parse(self.ordering_key.clone(), self.ordering_on_failure)?;
        Ok(Links { after: self.after.clone(), ordering })
    }

    /// Validate against the catalogue and what this deployment admits, and turn into a row to
    /// insert.
    pub fn into_new_job(
        self,
        key: IdempotencyKey,
        catalogue: &Catalogue,
        admits: &Admission,
        now: DateTime<Utc>,
    ) -> Result<NewJob, ApiError> {
        if !catalogue.client_may_submit(&self.task_type) {
            return Err(ApiError::unprocessable(
                "unknown_task_type",
                format!("task type {:?} is not in the catalogue", self.task_type),
            )
            .with("field", "task_type")
            .with("available", catalogue.client_names()));
        }
        catalogue
            .check(&self.task_type, &self.params)
            .map_err(|e| ApiError::unprocessable("invalid_params", e.to_string()).with("field", e.field.clone()))?;
        let correlation_id = self.correlation_id.as_deref().map(CorrelationId::parse).transpose()?;
        let run_at = terms::due_at(self.run_at, self.delay_seconds, now)?;
        // A held job (a campaign awaiting its recipient pages) is not due until released.
        let run_at = if catalogue.admit(&self.task_type, &self.params).held { now + HELD_FOR } else { run_at };
        let limits = self.limits(catalogue, admits)?;
        let concurrency = Concurrency::parse(self.concurrency_key.clone(), self.concurrency_limit)?;
        if let Some(url) = &self.callback_url {
            crate::outbound::check_url(url, &admits.callback_allow).map_err(|why| {
                ApiError::unprocessable("invalid_field", format!("callback_url: {why}")).with("field", "callback_url")
            })?;
        }
        // The request as the client sent it (no minted id, no computed time) is what a replay
        // must match. Fields added later are left out when absent, so old hashes still match.
        let request_hash = RequestHash::of(&serde_json::to_vec(&self).unwrap_or_default());
        let id = JobId::new();
        Ok(NewJob {
            id,
            correlation_id: correlation_id.unwrap_or_else(|| CorrelationId::of_job(id)),
            task_type: self.task_type,
            params: self.params,
            idempotency_key: key,
            request_hash,
            parent_id: None,
            run_at,
            limits,
            concurrency,
            callback_url: self.callback_url,
        })
    }
}

impl JobRequest {
    /// The job's attempts and time limit: what the client gave, or the defaults, and for a task
    /// whose parameters need a longer attempt (`Task::needs_seconds`), at least that (given
    /// when the client named no `timeout_seconds`, refused when it named less).
    fn limits(&self, catalogue: &Catalogue, admits: &Admission) -> Result<Limits, ApiError> {
        let longest = admits.max_timeout_seconds;
        let needs = catalogue.needs_seconds(&self.task_type, &self.params);
        if let Some(n) = needs.filter(|n| *n > longest) {
            return Err(ApiError::unprocessable(
                "invalid_params",
                format!("params: these parameters need attempts of {n} s; this deployment's longest is {longest} s"),
            )
            .with("field", "params"));
        }
        let timeout = match (self.timeout_seconds, needs) {
            (None, Some(n)) => Some(n.max(terms::DEFAULT_TIMEOUT_SECONDS.min(longest))),
            (given, _) => given,
        };
        let limits = Limits::parse(self.max_attempts, timeout, longest)?;
        if let Some(n) = needs.filter(|n| limits.timeout_seconds() < *n) {
            return Err(ApiError::unprocessable(
                "invalid_field",
                format!(
                    "timeout_seconds: at least {n} for these parameters (the call's own time limit and its recording)"
                ),
            )
            .with("field", "timeout_seconds"));
        }
        Ok(limits)
    }
}

/// 202 for a new job, 200 for a replay of the same request, 422 for a key reused with another.
fn answer(inserted: Inserted, request_hash: &RequestHash) -> Result<(StatusCode, JobView), ApiError> {
    match inserted {
        Inserted::Created(job) => Ok((StatusCode::ACCEPTED, JobView::bare(job))),
        Inserted::Existing(job) if job.request_hash == request_hash.as_bytes() => {
            Ok((StatusCode::OK, JobView::bare(job)))
        }
        Inserted::Existing(job) => Err(ApiError::unprocessable(
            "idempotency_key_reused",
            format!("idempotency key {:?} was already used for a different request", job.idempotency_key),
        )
        .with("idempotency_key", job.idempotency_key.clone())
        .with("job_id", job.id.to_string())),
    }
}

/// `POST /v1/jobs`
#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", request_body = JobRequest,
    params(("Idempotency-Key" = String, Header, description = "1 to 200 visible ASCII characters",
        min_length = 1, max_length = 200, pattern = "^[!-~]{1,200}$")),
    security(("tenant_key" = [])),
    responses((status = 202, description = "created; the row has committed", body = JobView),
        (status = 200, description = "a replay of the same request", body = JobView),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, description = "a `callback_url` before `PUT /v1/callbacks` (`callbacks_not_configured`), a template the tenant has not stored (`unknown_template`), a destination it has not registered (`unknown_destination`), a `webhook.send` destination with no signing secret (`signing_secret_missing`), or an `after` id that is not one of its jobs (`unknown_dependency`)", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 429, description = "over the tenant's rate limit (`rate_limited`) or at its limit of unfinished jobs (`limit_reached`), with `Retry-After`", body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn submit(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    key: IdempotencyKey,
    JsonBody(req): JsonBody<JobRequest>,
) -> Result<Response, ApiError> {
    state.limits.check(tenant.id, 1)?;
    let links = req.links()?;
    let new = req.into_new_job(key, &state.catalogue, &state.admission, Utc::now())?;
    require_named(&state, tenant.id, &new).await?;
    require_after(&state, tenant.id, &links.after).await?;
    crate::telemetry::record_job(new.correlation_id.as_str(), new.id);
    if new.callback_url.is_some() {
        require_signing_secret(&state, tenant.id).await?;
    }
    state.quotas.admit_jobs(&state.pool, tenant.id, 1).await?;
    let hash = new.request_hash;
    let mut inserted = state.intake.enqueue_linked(tenant.id, vec![new], vec![links]).await?;
    let (status, job) = answer(inserted.remove(0), &hash)?;
    Ok((status, Json(job)).into_response())
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BatchRequest {
    /// 1 to 500 jobs, each a job request plus its own `idempotency_key`.
    #[schema(min_items = 1, max_items = 500)]
    pub jobs: Vec<Value>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BatchItemResult {
    /// 202 created, 200 replayed, 4xx refused (see `error`).
    pub status: u16,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub job: Option<JobView>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
}

/// `POST /v1/jobs:batch`: valid items are inserted in one transaction; each item gets its own
/// result, in order.
#[utoipa::path(post, path = "/v1/jobs:batch", tag = "jobs", request_body = BatchRequest,
    security(("tenant_key" = [])),
    responses((status = 200, body = BatchResults), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, description = "more valid jobs than the tenant's limit of unfinished jobs holds at all (`limit_reached`)", body = ErrorBody),
        (status = 422, body = ErrorBody), (status = 429, description = "over the tenant's rate limit (`rate_limited`), or the batch would cross its limit of unfinished jobs (`limit_reached`; nothing inserted), with `Retry-After`", body = ErrorBody)))]
pub async fn submit_batch(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    JsonBody(req): JsonBody<BatchRequest>,
) -> Result<Json<Value>, ApiError> {
    if req.jobs.is_empty() || req.jobs.len() > MAX_BATCH {
        return Err(ApiError::unprocessable("invalid_batch", format!("a batch holds 1 to {MAX_BATCH} jobs"))
            .with("field", "jobs"));
    }
    state.limits.check(tenant.id, req.jobs.len())?;
    let now = Utc::now();
    let mut parsed: Vec<Result<(NewJob, Links), ApiError>> = req
        .jobs
        .into_iter()
        .enumerate()
        .map(|(i, item)| parse_item(i, item, &state.catalogue, &state.admission, now))
        .collect();
    for (i, p) in parsed.iter_mut().enumerate() {
        let checked = match p {
            Ok((new, links)) => match require_named(&state, tenant.id, new).await {
                Ok(()) => require_after(&state, tenant.id, &links.after).await,
                Err(e) => Err(e),
            },
            Err(_) => Ok(()),
        };
        if let Err(e) = checked {
            let field = e.details.get("field").and_then(Value::as_str).map(|f| format!("jobs[{i}].{f}"));
            *p = Err(match field {
                Some(f) => e.with("field", f),
                None => e,
            });
        }
    }
    if parsed.iter().any(|p| p.as_ref().is_ok_and(|n| n.0.callback_url.is_some())) {
        require_signing_secret(&state, tenant.id).await?;
    }
    let (valid, links): (Vec<NewJob>, Vec<Links>) = parsed.iter().filter_map(|p| p.as_ref().ok().cloned()).unzip();
    // A batch that would cross the tenant's limit of unfinished jobs is refused whole.
    if !valid.is_empty() {
        state.quotas.admit_jobs(&state.pool, tenant.id, valid.len()).await?;
    }
    let mut inserted = state.intake.enqueue_linked(tenant.id, valid, links).await?.into_iter();
    let results: Vec<BatchItemResult> = parsed
        .into_iter()
        .map(|p| {
            let outcome = p.and_then(|(new, _)| {
                let ins = inserted
                    .next()
                    .ok_or_else(|| StoreError::Vanished(format!("idempotency key {:?}", new.idempotency_key)))?;
                answer(ins, &new.request_hash)
            });
            match outcome {
                Ok((status, job)) => BatchItemResult { status: status.as_u16(), job: Some(job), error: None },
                Err(e) => {
                    BatchItemResult { status: e.status.as_u16(), job: None, error: Some(e.body()["error"].clone()) }
                }
            }
        })
        .collect();
    Ok(Json(json!({ "results": results })))
}

fn parse_item(
    index: usize,
    item: Value,
    catalogue: &Catalogue,
    admits: &Admission,
    now: DateTime<Utc>,
) -> Result<(NewJob, Links), ApiError> {
    let at = |e: ApiError| {
        let field = e.details.get("field").and_then(Value::as_str).map(|f| format!("jobs[{index}].{f}"));
        match field {
            Some(f) => e.with("field", f),
            None => e,
        }
    };
    let Value::Object(mut obj) = item else {
        return Err(at(ApiError::unprocessable("invalid_field", "each job is an object").with("field", ".")));
    };
    let key = match obj.remove("idempotency_key") {
        Some(Value::String(k)) => {
            IdempotencyKey::parse(&k).map_err(|e| at(ApiError::from(e).with("field", "idempotency_key")))?
        }
        _ => {
            return Err(at(ApiError::unprocessable(
                "missing_idempotency_key",
                "each job needs an idempotency_key string",
            )
            .with("field", "idempotency_key")));
        }
    };
    let req: JobRequest = serde_path_to_error::deserialize(Value::Object(obj))
        .map_err(|e| at(ApiError::wrong_shape(e.path(), e.inner())))?;
    let links = req.links().map_err(at)?;
    Ok((req.into_new_job(key, catalogue, admits, now).map_err(at)?, links))
}

/// The jobs a job runs after must be this tenant's (at most `MAX_AFTER`): an unknown id and
/// another tenant's get the same answer, so no other tenant's job is revealed.
async fn require_after(state: &AppState, tenant_id: TenantId, after: &[JobId]) -> Result<(), ApiError> {
    if after.is_empty() {
        return Ok(());
    }
    if after.len() > dependencies::MAX_AFTER {
        return Err(ApiError::unprocessable(
            "invalid_field",
            format!("after: a job runs after at most {} jobs", dependencies::MAX_AFTER),
        )
        .with("field", "after"));
    }
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let found = dependencies::statuses(&db, tenant_id, after).await?;
    match after.iter().position(|id| !found.contains_key(id)) {
        None => Ok(()),
        // 409 as for every other thing a job names that its tenant does not have.
        Some(n) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "unknown_dependency",
            format!("after[{n}]: this tenant has no job with this id"),
        )
        .with("field", format!("after[{n}]"))),
    }
}

/// The stored template, or the destination, a job names must exist for its tenant: a job
/// naming a missing one is refused here, not failed later. A well-formed request that names
/// what the tenant has not stored yet is a conflict with its state (409), as a `callback_url`
/// before `PUT /v1/callbacks` is.
async fn require_named(state: &AppState, tenant_id: TenantId, new: &NewJob) -> Result<(), ApiError> {
    let names = state.catalogue.admit(&new.task_type, &new.params).names;
    if names.is_empty() {
        return Ok(());
    }
    let db = state.pool.get().await.map_err(StoreError::from)?;
    for Named { kind, field, name } in names {
        let (stored, code, path) = match kind {
            Stored::Template => {
                (crate::store::templates::get(&db, tenant_id, &name).await?.is_some(), "unknown_template", "templates")
            }
            Stored::Destination => (
                crate::store::destinations::get(&db, tenant_id, &name).await?.is_some(),
                "unknown_destination",
                "destinations",
            ),
            Stored::UrlOf { destination } => {
                let Some(d) = crate::store::destinations::get(&db, tenant_id, &destination).await? else { continue };
                let allow = &state.admission.callback_allow;
                crate::destinations::patterns::check_url(&name, &d.url_patterns, allow).map_err(|why| {
                    ApiError::unprocessable("url_not_allowed", format!("{field}: {why}")).with("field", field.clone())
                })?;
                if d.signing_secret_set_at.is_none() {
                    return Err(ApiError::new(
                        StatusCode::CONFLICT,
                        "signing_secret_missing",
                        format!(
                            "destination {destination:?} has no signing secret \
                             (PUT /v1/destinations/{destination}/signing-secret first)"
                        ),
                    )
                    .with("field", "destination"));
                }
                continue;
            }
        };
        if !stored {
            let what = code.trim_start_matches("unknown_");
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                code,
                format!("{field}: this tenant has no {what} {name:?} (PUT /v1/{path}/{name} first)"),
            )
            .with("field", field));
        }
    }
    Ok(())
}

/// A job's own `callback_url` is signed with its tenant's secret, which must exist.
async fn require_signing_secret(state: &AppState, tenant_id: TenantId) -> Result<(), ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    if crate::store::callbacks::get(&db, tenant_id).await?.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "callbacks_not_configured",
            "callback_url needs the tenant's signing secret: PUT /v1/callbacks first",
        )
        .with("field", "callback_url"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_hash_ignores_nothing_the_client_sent() {
        let cat = Catalogue::standard();
        let now = Utc::now();
        let req = |delay| JobRequest {
            task_type: "noop".into(),
            params: json!({}),
            correlation_id: None,
            run_at: None,
            delay_seconds: delay,
            max_attempts: None,
            timeout_seconds: None,
            concurrency_key: None,
            concurrency_limit: None,
            callback_url: None,
            after: vec![],
            ordering_key: None,
            ordering_on_failure: None,
        };
        let admits = Admission::default();
        let key = || IdempotencyKey::parse("k").unwrap();
        let a = req(None).into_new_job(key(), &cat, &admits, now).unwrap();
        let b = req(None).into_new_job(key(), &cat, &admits, now + chrono::Duration::seconds(5)).unwrap();
        let c = req(Some(5)).into_new_job(key(), &cat, &admits, now).unwrap();
        assert_eq!(a.request_hash, b.request_hash, "the same request later is a replay");
        assert_ne!(a.request_hash, c.request_hash);
        let after = JobRequest { after: vec![JobId::new()], ..req(None) };
        let d = after.into_new_job(key(), &cat, &admits, now).unwrap();
        assert_ne!(a.request_hash, d.request_hash, "the hash covers after");
        let none = serde_json::to_value(req(None)).unwrap();
        assert!(none.get("after").is_none(), "no after, no field: older requests hash as before");
    }
}
