//! Subscription topics: a tenant's per-topic opt-outs of its recipients' addresses
//! (`store::topics`). A send naming a topic (`email.send`'s `topic`, a campaign message's) is
//! skipped for an address opted out of it; the suppression list still blocks every send.
//! A topic may map onto an SES contact list and topic (`/v1/topics/{topic}/ses`): a live send
//! naming it then carries SES's list management options, and the tenant's opt-outs and
//! resubscribes of it are kept, in the same transaction, to be written to the SES contact by
//! the sweep (`maintenance::ses_contacts`).

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ErrorBody, page_limit};
use super::extract::{Caller, JsonBody};
use crate::email::content;
use crate::job::TenantId;
use crate::store::topics::{self, OptOut, SesTopic, SesTopicSet};
use crate::store::{GenericClient, StoreError, callbacks, message_events};

#[derive(Debug, Default, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct OptOutQuery {
    /// One address's opt-outs only.
    pub address: Option<String>,
    /// `next_after` of the previous page.
    pub after: Option<String>,
    /// 1 to 500; default 100.
    #[param(value_type = Option<i64>, minimum = 1, maximum = 500)]
    pub limit: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct OptOutList {
    pub opt_outs: Vec<OptOut>,
    /// Pass back as `after`; null on the last page.
    pub next_after: Option<String>,
}

/// `PUT /v1/topic-opt-outs/{address}/{topic}`'s optional body.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OptOutBody {
    /// The tenant's message the recipient opted out through: the `message.unsubscribed` (and
    /// later `message.resubscribed`) event is kept on it and reaches callbacks and the feed.
    #[serde(default)]
    pub message_id: Option<Uuid>,
}

fn address(raw: &str) -> Result<String, ApiError> {
    content::bare(raw).filter(|a| a == &raw.to_lowercase()).ok_or_else(|| {
        ApiError::unprocessable("invalid_address", format!("{raw:?} is not a bare email address"))
            .with("field", "address")
    })
}

fn topic(raw: &str) -> Result<String, ApiError> {
    topics::check_name(raw)
        .map_err(|m| ApiError::unprocessable("invalid_field", format!("topic: {m}")).with("field", "topic"))?;
    Ok(raw.to_owned())
}

/// `GET /v1/topic-opt-outs`: the caller's opt-outs by (address, topic).
#[utoipa::path(get, path = "/v1/topic-opt-outs", tag = "email", params(OptOutQuery), security(("tenant_key" = [])),
    responses((status = 200, body = OptOutList), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 422, body = ErrorBody)))]
pub async fn list(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    query: Result<Query<OptOutQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<OptOutList>, ApiError> {
    let Query(q) = query.map_err(ApiError::query)?;
    let limit = page_limit(q.limit.as_deref(), 100)?;
    let only = q.address.as_deref().map(address).transpose()?;
    let after = q.after.unwrap_or_default();
    let (a, t) = after.split_once(' ').unwrap_or((after.as_str(), ""));
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let page = topics::list(&db, tenant.id, only.as_deref(), (a, t), limit).await?;
    let next_after =
        (page.len() as i64 == limit).then(|| page.last().map(|o| format!("{} {}", o.address, o.topic))).flatten();
    Ok(Json(OptOutList { opt_outs: page, next_after }))
}

/// The path of `/v1/topic-opt-outs/{address}/{topic}`.
#[derive(Debug, Deserialize)]
pub struct OptOutPath {
    pub address: String,
    pub topic: String,
}

/// `PUT /v1/topic-opt-outs/{address}/{topic}`: opt an address out of a topic.
#[utoipa::path(put, path = "/v1/topic-opt-outs/{address}/{topic}", tag = "email",
    params(("address" = String, Path), ("topic" = String, Path)), request_body = Option<OptOutBody>,
    security(("tenant_key" = [])),
    responses((status = 204, description = "opted out (or already)"), (status = 401, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the tenant's limit of topic opt-outs (`limit_reached`)"),
        (status = 422, body = ErrorBody)))]
pub async fn put(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(OptOutPath { address: raw, topic: name }): Path<OptOutPath>,
    body: axum::body::Bytes,
) -> Result<StatusCode, ApiError> {
    let (address, topic) = (address(&raw)?, topic(&name)?);
    // No body, or JSON `null` (as the document allows), is an opt-out without a message.
    let body: OptOutBody = if body.iter().all(u8::is_ascii_whitespace) {
        OptOutBody::default()
    } else {
        serde_path_to_error::deserialize::<_, Option<OptOutBody>>(&mut serde_json::Deserializer::from_slice(&body))
            .map_err(|e| ApiError::wrong_shape(e.path(), e.inner()))?
            .unwrap_or_default()
    };
    let message_id = body.message_id;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let name = crate::store::limits::topic_opt_out_name(&address, &topic);
    state.quotas.admit_row(&tx, tenant.id, crate::limits::Kind::TopicOptOuts, &name).await?;
    let new = topics::opt_out(&tx, tenant.id, std::slice::from_ref(&address), &topic, "api", message_id).await?;
    if !new.is_empty() {
        // Written to the SES contact by the sweep when the topic is mapped (no call from here).
        topics::queue_ses_change(&tx, tenant.id, &address, &topic, true).await?;
        if let Some(m) = message_id {
            notify(&tx, tenant.id, m, "unsubscribed", &address, &topic).await?;
        }
    }
    tx.commit().await.map_err(StoreError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

/// `DELETE /v1/topic-opt-outs/{address}/{topic}`: resubscribe.
#[utoipa::path(delete, path = "/v1/topic-opt-outs/{address}/{topic}", tag = "email",
    params(("address" = String, Path), ("topic" = String, Path)), security(("tenant_key" = [])),
    responses((status = 204, description = "resubscribed"), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(OptOutPath { address: raw, topic: name }): Path<OptOutPath>,
) -> Result<StatusCode, ApiError> {
    let (address, topic) = (raw.to_lowercase(), topic(&name)?);
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    let tx = db.transaction().await.map_err(StoreError::from)?;
    let Some(gone) = topics::resubscribe(&tx, tenant.id, &address, &topic).await? else {
        return Err(ApiError::not_found());
    };
    topics::queue_ses_change(&tx, tenant.id, &address, &topic, false).await?;
    if let Some(m) = gone.message_id {
        notify(&tx, tenant.id, m, "resubscribed", &address, &topic).await?;
    }
    tx.commit().await.map_err(StoreError::from)?;
    Ok(StatusCode::NO_CONTENT)
}

/// Keep the change as an event on its message and queue its callback (sent by the sweep).
async fn notify(
    db: &impl GenericClient,
    tenant: TenantId,
    message: Uuid,
    kind: &str,
    address: &str,
    topic: &str,
) -> Result<(), StoreError> {
    if let Some(id) = message_events::record_topic_change(db, tenant, message, kind, address, topic).await?
        && let Some(t) = message_events::webhook_type(kind)
    {
        callbacks::enqueue_message_event(db, id, t).await?;
    }
    Ok(())
}

/// `PUT /v1/topics/{topic}/ses`'s body: where the topic maps onto in SES.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SesTopicBody {
    /// An SES contact list of the account's (`ContactListName`).
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub contact_list: String,
    /// A topic of that list (`TopicName`).
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub ses_topic: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SesTopicList {
    pub topics: Vec<SesTopic>,
}

/// An SES name, held to a topic's rule (1 to 64 letters, digits, `_`, `-` or `.`).
fn ses_name(field: &'static str, raw: &str) -> Result<(), ApiError> {
    topics::check_name(raw)
        .map_err(|m| ApiError::unprocessable("invalid_field", format!("{field}: {m}")).with("field", field))
}

/// `PUT /v1/topics/{topic}/ses`: map the topic onto an SES contact list and topic.
#[utoipa::path(put, path = "/v1/topics/{topic}/ses", tag = "email", params(("topic" = String, Path)),
    request_body = SesTopicBody, security(("tenant_key" = [])),
    responses((status = 200, body = SesTopic), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "the tenant maps 100 other topics (`limit_reached`)"),
        (status = 422, body = ErrorBody)))]
pub async fn put_ses(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
    JsonBody(b): JsonBody<SesTopicBody>,
) -> Result<Json<SesTopic>, ApiError> {
    let name = topic(&name)?;
    ses_name("contact_list", &b.contact_list)?;
    ses_name("ses_topic", &b.ses_topic)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    match topics::set_ses_topic(&db, tenant.id, &name, &b.contact_list, &b.ses_topic).await? {
        SesTopicSet::Set(t) => Ok(Json(t)),
        SesTopicSet::Full => Err(ApiError::new(
            StatusCode::CONFLICT,
            "limit_reached",
            format!("at most {} topics map onto SES", topics::MAX_SES_TOPICS),
        )
        .with("limit", topics::MAX_SES_TOPICS)),
    }
}

/// `GET /v1/topics/ses`: the caller's topics that map onto SES.
#[utoipa::path(get, path = "/v1/topics/ses", tag = "email", security(("tenant_key" = [])),
    responses((status = 200, body = SesTopicList), (status = 401, body = ErrorBody)))]
pub async fn list_ses(State(state): State<AppState>, Caller(tenant): Caller) -> Result<Json<SesTopicList>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    Ok(Json(SesTopicList { topics: topics::ses_topics(&db, tenant.id).await? }))
}

/// `DELETE /v1/topics/{topic}/ses`: stop mapping the topic onto SES (its opt-outs stay).
#[utoipa::path(delete, path = "/v1/topics/{topic}/ses", tag = "email", params(("topic" = String, Path)),
    security(("tenant_key" = [])),
    responses((status = 204, description = "no longer mapped"), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn delete_ses(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let name = topic(&name)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    if topics::delete_ses_topic(&db, tenant.id, &name).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::not_found())
    }
}
