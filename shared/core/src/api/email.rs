//! Email resources: messages (with their provider events), the suppression list and templates
//! (tenant key, scoped to the caller); the tenants' sending identities (operator key).

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ErrorBody, page_limit};
use super::extract::{Caller, JsonBody, Operator};
use crate::credentials;
use crate::email::campaign::{self, CampaignParams, Recipient};
use crate::email::content;
use crate::email::task::SendCampaign;
use crate::job::{JobId, JobStatus, TenantId};
use crate::limits::Kind;
use crate::store::message_events::{self, MessageEvent, TenantEvent};
use crate::store::messages::{self, Message, Preview};
use crate::store::suppressions::{self, Suppression};
use crate::store::templates::{self, Template};
use crate::store::{StoreError, sending_identities};
use crate::store::{campaign_pages, jobs};
use crate::task::Task;
use crate::transport;

/// Query of `GET /v1/messages`: one correlation id's messages, one job's, or (neither given)
/// the most recent.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MessageQuery {
    pub correlation_id: Option<String>,
    #[param(value_type = Option<uuid::Uuid>)]
    pub job_id: Option<String>,
    /// 1 to 500; default 100.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct MessageList {
    pub messages: Vec<Message>,
}

/// A message and everything SES said about it.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageDetail {
    #[serde(flatten)]
    pub message: Message,
    pub events: Vec<MessageEvent>,
    /// For a shadowed message: exactly what would have been sent (addressing, rendered
    /// subject and bodies, headers and tags, Relay's own included). Null for a message
    /// really sent or refused.
    pub preview: Option<Preview>,
}

/// `GET /v1/messages[?correlation_id=|job_id=]`: the caller's messages, newest first.
#[utoipa::path(get, path = "/v1/messages", tag = "email", params(MessageQuery), security(("tenant_key" = [])),
    responses((status = 200, body = MessageList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_messages(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    query: Result<Query<MessageQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<MessageList>, ApiError> {
    let Query(q) = query.map_err(ApiError::query)?;
    let job_id = match q.job_id.as_deref() {
        None => None,
        Some(s) => Some(s.parse::<JobId>().map_err(|_| ApiError::invalid_query("job_id", "job_id is not a job id"))?),
    };
    let limit = page_limit(q.limit.as_deref(), 100)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let list = messages::list(&db, tenant.id, q.correlation_id.as_deref(), job_id, limit).await?;
    Ok(Json(MessageList { messages: list }))
}

/// `GET /v1/messages/{id}`: one message, its status and its events.
#[utoipa::path(get, path = "/v1/messages/{id}", tag = "email", params(("id" = String, Path)), security(("tenant_key" = [])),
    responses((status = 200, body = MessageDetail), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_message(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
) -> Result<Json<MessageDetail>, ApiError> {
    let id = Uuid::parse_str(&id).map_err(|_| ApiError::not_found())?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let message = messages::get(&db, tenant.id, id).await?.ok_or_else(ApiError::not_found)?;
    let events = message_events::events(&db, id).await?;
    let preview = messages::preview(&db, tenant.id, id).await?;
    Ok(Json(MessageDetail { message, events, preview }))
}

/// Query of `GET /v1/messages/events`.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct MessageEventQuery {
    /// An RFC 3339 time, or a `resume_cursor`.
    pub updated_since: Option<String>,
    /// A `next_cursor`.
    #[param(pattern = "^A[A-Za-z0-9_-]{31}$")]
    pub cursor: Option<String>,
    /// 1 to 500; default 100.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
}

/// One page of the message event feed.
#[derive(Debug, Serialize, ToSchema)]
pub struct MessageEventPage {
    pub events: Vec<TenantEvent>,
    /// Pass back as `cursor`; null on the last page.
    pub next_cursor: Option<String>,
    /// Pass back later as `updated_since` for every event received after this page (always
    /// present; it stays `SETTLE_SECONDS` behind the clock, so an event may come twice, none
    /// is missed).
    pub resume_cursor: String,
}

/// A feed position: the event's receipt time and its id (held in the cursor's id field).
fn event_cursor(c: &str) -> Option<(DateTime<Utc>, i64)> {
    super::cursor::decode(c).map(|(at, id)| (at, i64::try_from(id.as_u128()).unwrap_or(i64::MAX)))
}

fn encode_event_cursor((at, id): (DateTime<Utc>, i64)) -> String {
    super::cursor::encode(at, Uuid::from_u128(u128::try_from(id).unwrap_or(0)))
}

/// `GET /v1/messages/events`: the caller's message events (every type, whatever its callbacks
/// subscribe to) in the order Relay received them: replay what callbacks delivered or missed.
#[utoipa::path(get, path = "/v1/messages/events", tag = "email", params(MessageEventQuery),
    security(("tenant_key" = [])),
    responses((status = 200, body = MessageEventPage), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn message_events(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    query: Result<Query<MessageEventQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<MessageEventPage>, ApiError> {
    let Query(q) = query.map_err(ApiError::query)?;
    let mut after = (DateTime::<Utc>::UNIX_EPOCH, 0);
    if let Some(s) = q.updated_since.as_deref() {
        after = match DateTime::parse_from_rfc3339(s) {
            Ok(t) => (t.with_timezone(&Utc), 0),
            Err(_) => event_cursor(s).ok_or_else(|| {
                ApiError::invalid_query(
                    "updated_since",
                    "updated_since must be an RFC 3339 time or a cursor this API issued",
                )
            })?,
        };
    }
    if let Some(c) = q.cursor.as_deref() {
        after =
            event_cursor(c).ok_or_else(|| ApiError::invalid_query("cursor", "cursor is not one this API issued"))?;
    }
    let limit = page_limit(q.limit.as_deref(), 100)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let events = message_events::tenant_events(&db, tenant.id, after, limit).await?;
    let last = events.last().map(|e| (e.received_at, e.id));
    let next_cursor = (events.len() as i64 == limit).then_some(last).flatten().map(encode_event_cursor);
    let settled = (Utc::now() - chrono::Duration::seconds(super::jobs::SETTLE_SECONDS), 0);
    let reached = last.unwrap_or(after);
    let resume_cursor = encode_event_cursor(if reached < settled { reached } else { settled });
    Ok(Json(MessageEventPage { events, next_cursor, resume_cursor }))
}

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct SuppressionQuery {
    /// The last address of the previous page.
    pub after: Option<String>,
    /// 1 to 500; default 100.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SuppressionList {
    pub suppressions: Vec<Suppression>,
    /// Pass back as `after`; null on the last page.
    pub next_after: Option<String>,
}

/// `GET /v1/suppressions`: the caller's suppression list, by address.
#[utoipa::path(get, path = "/v1/suppressions", tag = "email", params(SuppressionQuery), security(("tenant_key" = [])),
    responses((status = 200, body = SuppressionList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_suppressions(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    query: Result<Query<SuppressionQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<SuppressionList>, ApiError> {
    let Query(q) = query.map_err(ApiError::query)?;
    let limit = page_limit(q.limit.as_deref(), 100)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let page = suppressions::list(&db, tenant.id, q.after.as_deref().unwrap_or(""), limit).await?;
    let next_after = (page.len() as i64 == limit).then(|| page.last().map(|s| s.address.clone())).flatten();
    Ok(Json(SuppressionList { suppressions: page, next_after }))
}

fn address(raw: &str) -> Result<String, ApiError> {
    content::bare(raw).filter(|a| a == &raw.to_lowercase()).ok_or_else(|| {
        ApiError::unprocessable("invalid_address", format!("{raw:?} is not a bare email address"))
            .with("field", "address")
    })
}

/// `PUT /v1/suppressions/{address}`: suppress an address by hand; a new one past the tenant's
/// limit (which counts every suppression, bounces' too) is 409 `limit_reached`.
#[utoipa::path(put, path = "/v1/suppressions/{address}", tag = "email", params(("address" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 204, description = "listed"), (status = 401, body = ErrorBody),
        (status = 409, description = "a new suppression past the tenant's limit (`limit_reached`)", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn add_suppression(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(raw): Path<String>,
) -> Result<StatusCode, ApiError> {
    let address = address(&raw)?;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    state.quotas.admit_row(&tx, tenant.id, Kind::Suppressions, &address).await?;
    suppressions::add(&tx, tenant.id, &[address], "manual", None, None).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/suppressions/{address}`: send to this address again.
#[utoipa::path(delete, path = "/v1/suppressions/{address}", tag = "email", params(("address" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 204, description = "removed"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn remove_suppression(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(raw): Path<String>,
) -> Result<StatusCode, ApiError> {
    let address = raw.to_lowercase();
    let db = state.pool.get().await.map_err(StoreError::from)?;
    if suppressions::remove(&db, tenant.id, &address).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found())
    }
}

/// A template to store: minijinja syntax; `text`, `html` or both.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TemplateBody {
    pub subject: String,
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub html: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TemplateList {
    pub templates: Vec<Template>,
}

fn template_name(name: &str) -> Result<(), ApiError> {
    templates::check_name(name)
        .map_err(|m| ApiError::unprocessable("invalid_field", format!("name: {m}")).with("field", "name"))
}

/// `PUT /v1/templates/{name}`: create or replace a template; a syntax error is a 422 naming the
/// part; a new name past the tenant's limit is 409 `limit_reached` (replacing one never is).
#[utoipa::path(put, path = "/v1/templates/{name}", tag = "email", params(("name" = String, Path)), request_body = TemplateBody,
    security(("tenant_key" = [])),
    responses((status = 200, body = Template), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, description = "a new template past the tenant's limit (`limit_reached`)", body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn put_template(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    JsonBody(body): JsonBody<TemplateBody>,
) -> Result<Json<Template>, ApiError> {
    template_name(&name)?;
    if body.subject.trim().is_empty() {
        return Err(ApiError::unprocessable("invalid_field", "subject: must not be empty").with("field", "subject"));
    }
    if body.text.is_none() && body.html.is_none() {
        return Err(ApiError::unprocessable("invalid_field", "text: give text, html or both").with("field", "text"));
    }
    content::compile_check(&body.subject, body.text.as_deref(), body.html.as_deref())
        .map_err(|e| ApiError::unprocessable("template_syntax", e.to_string()).with("field", e.field))?;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    state.quotas.admit_row(&tx, tenant.id, Kind::Templates, &name).await?;
    let t = templates::put(&tx, tenant.id, &name, &body.subject, body.text.as_deref(), body.html.as_deref()).await?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Json(t))
}

/// `GET /v1/templates`
#[utoipa::path(get, path = "/v1/templates", tag = "email", security(("tenant_key" = [])),
    responses((status = 200, body = TemplateList), (status = 401, body = ErrorBody)))]
pub async fn list_templates(
    State(state): State<AppState>,
    Caller(tenant): Caller,
) -> Result<Json<TemplateList>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    Ok(Json(TemplateList { templates: templates::list(&db, tenant.id).await? }))
}

/// `GET /v1/templates/{name}`
#[utoipa::path(get, path = "/v1/templates/{name}", tag = "email", params(("name" = String, Path)), security(("tenant_key" = [])),
    responses((status = 200, body = Template), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_template(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
) -> Result<Json<Template>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    templates::get(&db, tenant.id, &name).await?.map(Json).ok_or_else(ApiError::not_found)
}

/// `DELETE /v1/templates/{name}`
#[utoipa::path(delete, path = "/v1/templates/{name}", tag = "email", params(("name" = String, Path)), security(("tenant_key" = [])),
    responses((status = 204, description = "deleted"), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn delete_template(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    if templates::delete(&db, tenant.id, &name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found())
    }
}

/// A tenant's sending identities: addresses (`noreply@acme.example`) or domains (`acme.example`).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Identities {
    pub identities: Vec<String>,
}

fn tenant_path(raw: &str) -> Result<TenantId, ApiError> {
    raw.parse().map_err(|_| ApiError::not_found())
}

/// `GET /v1/admin/tenants/{tenant_id}/sending-identities`
#[utoipa::path(get, path = "/v1/admin/tenants/{tenant_id}/sending-identities", tag = "operations",
    params(("tenant_id" = String, Path)), security(("operator_key" = [])),
    responses((status = 200, body = Identities), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_identities(
    State(state): State<AppState>,
    Operator(_): Operator,
    Path(raw): Path<String>,
) -> Result<Json<Identities>, ApiError> {
    let tenant = tenant_path(&raw)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    crate::store::tenants::by_id(&db, tenant).await?.ok_or_else(ApiError::not_found)?;
    Ok(Json(Identities { identities: sending_identities::list(&db, tenant).await? }))
}

/// `PUT /v1/admin/tenants/{tenant_id}/sending-identities`: replace the list.
#[utoipa::path(put, path = "/v1/admin/tenants/{tenant_id}/sending-identities", tag = "operations",
    params(("tenant_id" = String, Path)), request_body = Identities, security(("operator_key" = [])),
    responses((status = 200, body = Identities), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put_identities(
    State(state): State<AppState>,
    Operator(operator): Operator,
    Path(raw): Path<String>,
    JsonBody(body): JsonBody<Identities>,
) -> Result<Json<Identities>, ApiError> {
    let tenant = tenant_path(&raw)?;
    for (i, identity) in body.identities.iter().enumerate() {
        if !content::valid_identity(identity) {
            return Err(ApiError::unprocessable(
                "invalid_field",
                format!("identities[{i}]: {identity:?} is not an address or a domain"),
            )
            .with("field", format!("identities[{i}]")));
        }
    }
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    crate::store::tenants::by_id(&db, tenant).await?.ok_or_else(ApiError::not_found)?;
    let identities = sending_identities::set(&mut db, tenant, &body.identities).await?;
    tracing::info!(event = "relay.tenant.sending_identities", tenant_id = %tenant, operator = %operator.name, ?identities,
        "sending identities replaced");
    Ok(Json(Identities { identities }))
}

/// One page of a campaign's recipients.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RecipientPage {
    pub recipients: Vec<Recipient>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PageReceipt {
    pub page: u32,
    pub pages_received: i64,
    pub pages: u32,
    /// Every page is in: the campaign is due now.
    pub released: bool,
}

/// The path of `PUT /v1/jobs/{id}/recipients/{page}`.
#[derive(Debug, Deserialize)]
pub struct JobPage {
    pub id: String,
    pub page: String,
}

/// `PUT /v1/jobs/{id}/recipients/{page}`: one page (up to 5,000) of a paged `email.campaign`'s
/// recipients; idempotent per page. When the last page lands, the campaign falls due.
#[utoipa::path(put, path = "/v1/jobs/{id}/recipients/{page}", tag = "email",
    params(("id" = String, Path), ("page" = u32, Path)), request_body = RecipientPage, security(("tenant_key" = [])),
    responses((status = 201, body = PageReceipt), (status = 200, body = PageReceipt, description = "a replay of a stored page"),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn put_recipients(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(JobPage { id, page }): Path<JobPage>,
    JsonBody(body): JsonBody<RecipientPage>,
) -> Result<(StatusCode, Json<PageReceipt>), ApiError> {
    let id = super::jobs::parse_id(&id)?;
    let page: u32 = page.parse().map_err(|_| {
        ApiError::unprocessable("invalid_field", "page: a page number (0, 1, ...)").with("field", "page")
    })?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let job = jobs::get(&db, tenant.id, id).await?.ok_or_else(ApiError::not_found)?;
    let not_paged = || {
        ApiError::new(StatusCode::CONFLICT, "not_a_paged_campaign", "this job is not an email.campaign taking pages")
    };
    if job.task_type != SendCampaign::NAME {
        return Err(not_paged());
    }
    let campaign: CampaignParams = serde_json::from_value(job.params.clone()).map_err(|_| not_paged())?;
    let pages = campaign.pages.ok_or_else(not_paged)?;
    // A page past the campaign's own count conflicts with the campaign; recipients of the
    // wrong shape, or whose data the message does not render with, are 422.
    campaign::check_page(&campaign, page, &body.recipients).map_err(|e| {
        if e.field == "page" {
            ApiError::new(StatusCode::CONFLICT, "page_out_of_range", e.to_string()).with("field", e.field)
        } else {
            ApiError::unprocessable("invalid_field", e.to_string()).with("field", e.field)
        }
    })?;
    if job.status != JobStatus::Pending {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "job_state",
            format!("the campaign is {}; pages are taken while it is pending", job.status.as_str()),
        ));
    }
    let page_no = i32::try_from(page).unwrap_or(i32::MAX);
    let (stored, received) = campaign_pages::put(&db, id, page_no, &serde_json::json!(body.recipients)).await?;
    if stored == campaign_pages::Stored::Conflict {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "page_conflict",
            format!("page {page} was stored with other recipients"),
        ));
    }
    let mut released = false;
    if received == i64::from(pages)
        && let Some(d) = jobs::release(&db, id).await?
    {
        drop(db);
        transport::send(&state.transport, &state.pool, &[d]).await;
        released = true;
    }
    let status = if stored == campaign_pages::Stored::New { StatusCode::CREATED } else { StatusCode::OK };
    Ok((status, Json(PageReceipt { page, pages_received: received, pages, released })))
}

/// The caller's own sending role: `email.send` runs under it, assumed with `external_id`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SendingRole {
    /// Null until the tenant names one (then the platform's own sending role is used).
    pub role_arn: Option<String>,
    /// What the role's trust policy must require (`sts:ExternalId`): Relay's, one per tenant.
    pub external_id: String,
}

#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendingRoleBody {
    /// `arn:aws:iam::<account>:role/<name>` in the tenant's account; null to stop using one.
    pub role_arn: Option<String>,
}

/// `GET /v1/sending-role`: the caller's sending role and the external id its trust policy needs.
#[utoipa::path(get, path = "/v1/sending-role", tag = "email", security(("tenant_key" = [])),
    responses((status = 200, body = SendingRole), (status = 401, body = ErrorBody)))]
pub async fn get_sending_role(
    State(state): State<AppState>,
    Caller(tenant): Caller,
) -> Result<Json<SendingRole>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let role_arn = sending_identities::role(&db, tenant.id).await?;
    Ok(Json(SendingRole { role_arn, external_id: credentials::tenant_external_id(tenant.id) }))
}

/// `PUT /v1/sending-role`: name (or clear) the role in the caller's account that sends its email.
#[utoipa::path(put, path = "/v1/sending-role", tag = "email", request_body = SendingRoleBody, security(("tenant_key" = [])),
    responses((status = 200, body = SendingRole), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn put_sending_role(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    JsonBody(body): JsonBody<SendingRoleBody>,
) -> Result<Json<SendingRole>, ApiError> {
    if let Some(arn) = &body.role_arn
        && !credentials::valid_role_arn(arn)
    {
        return Err(ApiError::unprocessable(
            "invalid_field",
            "role_arn: not an IAM role ARN (arn:aws:iam::<account>:role/<name>)",
        )
        .with("field", "role_arn"));
    }
    let db = state.pool.get().await.map_err(StoreError::from)?;
    sending_identities::set_role(&db, tenant.id, body.role_arn.as_deref()).await?;
    Ok(Json(SendingRole { role_arn: body.role_arn, external_id: credentials::tenant_external_id(tenant.id) }))
}
