//! Callbacks: a tenant's endpoint and signing secrets, the record of every delivery attempt,
//! and the statement fragment that creates delivery jobs inside a terminal write.

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio_postgres::Row;
use utoipa::ToSchema;

use super::{GenericClient, StoreError};
use crate::job::{JobId, TenantId};

/// The platform task that delivers a callback.
pub const TASK_TYPE: &str = "callback.deliver";
/// Attempts of one delivery; with `RetryPolicy::CALLBACKS` they spread over about three days.
pub const MAX_ATTEMPTS: i32 = 16;
/// Per-attempt limit of a delivery job (the HTTP call itself has a shorter timeout).
pub const TIMEOUT_SECONDS: i32 = 60;
/// The deliveries are inserted by SQL (`enqueue_ctes`), not as a `NewJob`: their limits are
/// held to the bounds of any job here, at build time.
const _: crate::job::terms::Limits = crate::job::terms::Limits::fixed(MAX_ATTEMPTS, TIMEOUT_SECONDS);

/// Columns every terminal write returns (in `store::jobs` and `store::dependencies`): what
/// `enqueue_ctes` reads, and `has_dependents`, which says whether dependents are to be released.
pub(crate) const TERMINAL_RETURNING: &str = "j.id, j.attempt, j.started_at, j.tenant_id, j.status, j.correlation_id, j.parent_id, j.task_type, j.callback_url, \
     j.has_dependents";

/// A tenant's callback settings. The secrets are never serialised.
#[derive(Debug, Clone)]
pub struct Settings {
    pub tenant_id: TenantId,
    pub url: Option<String>,
    pub secret: String,
    pub previous_secret: Option<String>,
    pub previous_until: Option<DateTime<Utc>>,
    pub secret_created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    /// The message event types its callbacks carry (`message.bounced`...).
    pub message_events: Vec<String>,
}

/// The message event types a tenant's callbacks carry unless it chooses: the terminal and
/// negative ones (the column's default, migration 0027).
pub const DEFAULT_MESSAGE_EVENTS: [&str; 4] =
    ["message.bounced", "message.complained", "message.rejected", "message.suppressed"];

impl Settings {
    fn from_row(r: &Row) -> Self {
        Settings {
            tenant_id: r.get("tenant_id"),
            url: r.get("url"),
            secret: r.get("secret"),
            previous_secret: r.get("previous_secret"),
            previous_until: r.get("previous_until"),
            secret_created_at: r.get("secret_created_at"),
            updated_at: r.get("updated_at"),
            message_events: r.get("message_events"),
        }
    }

    /// The secrets that sign now: the current one, and the previous one until its rotation
    /// window ends.
    pub fn signing_secrets(&self, now: DateTime<Utc>) -> Vec<&str> {
        let mut s = vec![self.secret.as_str()];
        if let (Some(p), Some(until)) = (&self.previous_secret, self.previous_until)
            && until > now
        {
            s.push(p);
        }
        s
    }
}

const COLUMNS: &str =
    "tenant_id, url, secret, previous_secret, previous_until, secret_created_at, updated_at, message_events";

pub async fn get(db: &impl GenericClient, tenant_id: TenantId) -> Result<Option<Settings>, StoreError> {
    let row =
        db.query_opt(&format!("SELECT {COLUMNS} FROM tenant_callbacks WHERE tenant_id = $1"), &[&tenant_id]).await?;
    Ok(row.as_ref().map(Settings::from_row))
}

/// Set the tenant's URL (or none) and, if given, the message event types it subscribes to
/// (kept as they were otherwise; `DEFAULT_MESSAGE_EVENTS` at first). The first call creates the
/// settings with `new_secret`; returns the settings and whether they were created (so the
/// secret is shown once).
pub async fn set_url(
    db: &impl GenericClient,
    tenant_id: TenantId,
    url: Option<&str>,
    message_events: Option<&[String]>,
    new_secret: &str,
) -> Result<(Settings, bool), StoreError> {
    let row = db
        .query_one(
            &format!(
                "INSERT INTO tenant_callbacks (tenant_id, url, secret, message_events)
                 VALUES ($1, $2, $3, coalesce($4::text[], $5::text[]))
                 ON CONFLICT (tenant_id) DO UPDATE SET url = excluded.url,
                     message_events = coalesce($4::text[], tenant_callbacks.message_events), updated_at = now()
                 RETURNING {COLUMNS}, (xmax = 0) AS created"
            ),
            &[&tenant_id, &url, &new_secret, &message_events, &DEFAULT_MESSAGE_EVENTS.as_slice()],
        )
        .await?;
    Ok((Settings::from_row(&row), row.get("created")))
}

/// Replace the secret; the old one keeps signing for `overlap_secs` more. A rotation during a
/// rotation drops the oldest secret (at most two are ever valid). None when not configured.
pub async fn rotate(
    db: &impl GenericClient,
    tenant_id: TenantId,
    new_secret: &str,
    overlap_secs: f64,
) -> Result<Option<Settings>, StoreError> {
    let row = db
        .query_opt(
            &format!(
                "UPDATE tenant_callbacks SET previous_secret = secret,
                     previous_until = now() + make_interval(secs => $3),
                     secret = $2, secret_created_at = now(), updated_at = now()
                 WHERE tenant_id = $1 RETURNING {COLUMNS}"
            ),
            &[&tenant_id, &new_secret, &overlap_secs],
        )
        .await?;
    Ok(row.as_ref().map(Settings::from_row))
}

/// Remove the settings: no more callbacks (deliveries already queued find none and stop).
pub async fn delete(db: &impl GenericClient, tenant_id: TenantId) -> Result<bool, StoreError> {
    Ok(db.execute("DELETE FROM tenant_callbacks WHERE tenant_id = $1", &[&tenant_id]).await? == 1)
}

/// What came of one delivery attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// A 2xx answer.
    Delivered,
    /// Another answer, a redirect, or no answer; retried while attempts last.
    Failed,
    /// Not sent: the URL is invalid or resolves to an address callbacks may not reach.
    Refused,
    /// Not sent: shadow mode, or the `write:callbacks` switch is off.
    Shadowed,
    /// 410 Gone: the endpoint asked for no more; not retried.
    Gone,
    /// Not sent: no callback URL or no signing secret any more.
    Skipped,
}

impl Outcome {
    fn as_str(self) -> &'static str {
        match self {
            Outcome::Delivered => "delivered",
            Outcome::Failed => "failed",
            Outcome::Refused => "refused",
            Outcome::Shadowed => "shadowed",
            Outcome::Gone => "gone",
            Outcome::Skipped => "skipped",
        }
    }

    fn parse(s: &str) -> Option<Outcome> {
        [Outcome::Delivered, Outcome::Failed, Outcome::Refused, Outcome::Shadowed, Outcome::Gone, Outcome::Skipped]
            .into_iter()
            .find(|o| o.as_str() == s)
    }
}

/// One attempt to deliver a callback, as recorded and as `GET /v1/jobs/{id}/callbacks` shows it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct Attempt {
    #[serde(skip)]
    pub job_id: JobId,
    #[serde(skip)]
    pub tenant_id: TenantId,
    /// The platform job delivering this callback (also the `webhook-id`, as `cb_<id>`).
    #[schema(value_type = uuid::Uuid)]
    pub delivery_job_id: JobId,
    pub attempt: i32,
    /// `job.<status>`.
    pub event: String,
    pub url: String,
    pub outcome: Outcome,
    pub http_status: Option<i32>,
    pub error: Option<String>,
    pub duration_ms: Option<i32>,
    pub at: Option<DateTime<Utc>>,
}

pub async fn record_attempt(db: &impl GenericClient, a: &Attempt) -> Result<(), StoreError> {
    db.execute(
        "INSERT INTO callback_attempts (job_id, tenant_id, delivery_job_id, attempt, event, url, outcome,
                                        http_status, error, duration_ms)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
        &[
            &a.job_id,
            &a.tenant_id,
            &a.delivery_job_id,
            &a.attempt,
            &a.event,
            &a.url,
            &a.outcome.as_str(),
            &a.http_status,
            &a.error,
            &a.duration_ms,
        ],
    )
    .await?;
    Ok(())
}

/// A tenant's job's callback attempts, oldest first.
pub async fn attempts(db: &impl GenericClient, tenant_id: TenantId, job_id: JobId) -> Result<Vec<Attempt>, StoreError> {
    let rows = db
        .query(
            "SELECT job_id, tenant_id, delivery_job_id, attempt, event, url, outcome, http_status, error,
                    duration_ms, at
             FROM callback_attempts WHERE job_id = $1 AND tenant_id = $2 ORDER BY id",
            &[&job_id, &tenant_id],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Attempt {
                job_id: r.get(0),
                tenant_id: r.get(1),
                delivery_job_id: r.get(2),
                attempt: r.get(3),
                event: r.get(4),
                url: r.get(5),
                outcome: super::decode("callback_attempts.outcome", r.get(6), Outcome::parse)?,
                http_status: r.get(7),
                error: r.get(8),
                duration_ms: r.get(9),
                at: r.get(10),
            })
        })
        .collect::<Result<_, StoreError>>()
}

/// CTEs that create a `callback.deliver` job (platform tenant) for each top-level job in the
/// CTE `source` that reached a terminal state and has somewhere to call back (its own
/// `callback_url`, or its tenant's). Appended to a terminal write, they commit with it.
/// Idempotent per job, status and attempt (`callback:<id>:<status>:<attempt>`), so a job that
/// fails again after an operator's retry calls back again. `source` must expose id, tenant_id,
/// status, attempt, correlation_id, parent_id, task_type and callback_url; the jobs created
/// are the CTE `callbacks` (id, run_at). `dispatched`: the caller dispatches them after commit
/// (otherwise the sweep does).
pub(crate) fn enqueue_ctes(source: &str, dispatched: bool) -> String {
    let dispatched_at = if dispatched { "now()" } else { "NULL::timestamptz" };
    format!(
        "cb AS (
             SELECT relay_uuid_v7() AS id, p.id AS platform, d.id AS subject, d.tenant_id, d.status,
                    d.correlation_id, 'callback:' || d.id || ':' || d.status || ':' || d.attempt AS key
             FROM {source} d, (SELECT id FROM tenants WHERE name = 'platform') p
             WHERE d.parent_id IS NULL AND d.task_type <> '{TASK_TYPE}'
               AND (d.callback_url IS NOT NULL
                    OR d.tenant_id IN (SELECT tenant_id FROM tenant_callbacks WHERE url IS NOT NULL))
         ), cb_keys AS (
             INSERT INTO job_keys (tenant_id, idempotency_key, correlation_id, job_id)
             SELECT platform, key, correlation_id, id FROM cb
             ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
             RETURNING job_id
         ), callbacks AS (
             INSERT INTO jobs (id, tenant_id, task_type, params, correlation_id, idempotency_key, request_hash,
                               run_at, max_attempts, timeout_seconds, dispatched_at)
             SELECT id, platform, '{TASK_TYPE}',
                    jsonb_build_object('job_id', subject, 'tenant_id', tenant_id, 'event', 'job.' || status),
                    correlation_id, key, sha256(convert_to(key, 'UTF8')), now(), {MAX_ATTEMPTS}, {TIMEOUT_SECONDS},
                    {dispatched_at}
             FROM cb WHERE id IN (SELECT job_id FROM cb_keys)
             RETURNING id, run_at
         )"
    )
}

/// Create the `callback.deliver` job of one message event (`message_events.id`), in the caller's
/// transaction, when its tenant has a callback URL and subscribes to `webhook_type`; the job
/// reports on the message's job and carries its correlation id. Idempotent per event
/// (`callback:message-event:<id>`). Left for the sweep to dispatch, like a job's callbacks that
/// are not dispatched by their writer. Returns the delivery job, if one was made.
pub async fn enqueue_message_event(
    db: &impl GenericClient,
    event_id: i64,
    webhook_type: &str,
) -> Result<Option<JobId>, StoreError> {
    let row = db
        .query_opt(
            &format!(
                "WITH cb AS (
                     SELECT relay_uuid_v7() AS id, p.id AS platform, m.job_id, m.tenant_id, m.correlation_id,
                            'callback:message-event:' || e.id AS key
                     FROM message_events e JOIN messages m ON m.id = e.message_id AND m.tenant_id = e.tenant_id
                     JOIN tenant_callbacks c ON c.tenant_id = m.tenant_id AND c.url IS NOT NULL
                          AND $2 = ANY (c.message_events),
                     (SELECT id FROM tenants WHERE name = 'platform') p
                     WHERE e.id = $1
                 ), cb_keys AS (
                     INSERT INTO job_keys (tenant_id, idempotency_key, correlation_id, job_id)
                     SELECT platform, key, correlation_id, id FROM cb
                     ON CONFLICT (tenant_id, idempotency_key) DO NOTHING
                     RETURNING job_id
                 )
                 INSERT INTO jobs (id, tenant_id, task_type, params, correlation_id, idempotency_key, request_hash,
                                   run_at, max_attempts, timeout_seconds)
                 SELECT id, platform, '{TASK_TYPE}',
                        jsonb_build_object('job_id', job_id, 'tenant_id', tenant_id, 'event', $2::text,
                                           'message_event', $1::bigint),
                        correlation_id, key, sha256(convert_to(key, 'UTF8')), now(), {MAX_ATTEMPTS}, {TIMEOUT_SECONDS}
                 FROM cb WHERE id IN (SELECT job_id FROM cb_keys)
                 RETURNING id"
            ),
            &[&event_id, &webhook_type],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}
