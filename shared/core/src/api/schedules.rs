//! Operator routes for schedules under `/v1/admin/schedules`: list, create, show, change
//! (pause, resume, params, expression), delete. Each answer reports the last run, its outcome
//! and the next run.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use chrono::Utc;
use serde::Serialize;
use utoipa::ToSchema;
use uuid::Uuid;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{JsonBody, Operator};
use crate::schedules::{self, ScheduleError, SchedulePatch, ScheduleSpec};
use crate::store::StoreError;
use crate::store::schedules::{self as store, Schedule};

impl From<ScheduleError> for ApiError {
    fn from(e: ScheduleError) -> Self {
        match e {
            ScheduleError::Invalid { field, code: code @ "unknown_tenant", message } => {
                ApiError::new(StatusCode::NOT_FOUND, code, message).with("field", field)
            }
            ScheduleError::Invalid { field, code, message } => {
                ApiError::unprocessable(code, message).with("field", field)
            }
            ScheduleError::Exists(name) => ApiError::new(
                StatusCode::CONFLICT,
                "schedule_exists",
                format!("a schedule named {name:?} exists already"),
            )
            .with("field", "name"),
            ScheduleError::NotFound => ApiError::not_found(),
            ScheduleError::Store(s) => ApiError::from(s),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ScheduleList {
    pub schedules: Vec<Schedule>,
}

fn parse_id(id: &str) -> Result<Uuid, ApiError> {
    Uuid::parse_str(id).map_err(|_| ApiError::not_found())
}

/// Every schedule, by name, with last run, last outcome and next run.
#[utoipa::path(get, path = "/v1/admin/schedules", tag = "operations", security(("operator_key" = [])),
    responses((status = 200, body = ScheduleList), (status = 401, body = ErrorBody)))]
pub async fn list(State(state): State<AppState>, Operator(_): Operator) -> Result<Json<ScheduleList>, ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    Ok(Json(ScheduleList { schedules: store::list(&db).await? }))
}

/// Create a schedule; its first run is the first slot after now.
#[utoipa::path(post, path = "/v1/admin/schedules", tag = "operations", request_body = ScheduleSpec,
    security(("operator_key" = [])),
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 201, body = Schedule),
        (status = 404, description = "no tenant of that name (`unknown_tenant`)", body = ErrorBody), (status = 409, body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn create(
    State(state): State<AppState>,
    Operator(op): Operator,
    JsonBody(spec): JsonBody<ScheduleSpec>,
) -> Result<(StatusCode, Json<Schedule>), ApiError> {
    let db = state.pool.get().await.map_err(StoreError::from)?;
    let s = schedules::add(&db, &state.catalogue, spec, &op.name, Utc::now()).await?;
    Ok((StatusCode::CREATED, Json(s)))
}

/// One schedule.
#[utoipa::path(get, path = "/v1/admin/schedules/{id}", tag = "operations", params(("id" = String, Path)),
    security(("operator_key" = [])),
    responses((status = 401, body = ErrorBody), (status = 200, body = Schedule), (status = 404, body = ErrorBody)))]
pub async fn get(
    State(state): State<AppState>,
    Operator(_): Operator,
    Path(id): Path<String>,
) -> Result<Json<Schedule>, ApiError> {
    let id = parse_id(&id)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    store::get(&db, id).await?.map(Json).ok_or_else(ApiError::not_found)
}

/// Change a schedule: pause (`enabled: false`), resume, params, expression, time zone, catch-up.
#[utoipa::path(patch, path = "/v1/admin/schedules/{id}", tag = "operations", params(("id" = String, Path)),
    request_body = SchedulePatch, security(("operator_key" = [])),
    responses((status = 400, body = ErrorBody), (status = 401, body = ErrorBody), (status = 200, body = Schedule), (status = 404, body = ErrorBody),
        (status = 409, description = "params the schedule's task type refuses (`invalid_params`)", body = ErrorBody), (status = 422, body = ErrorBody)))]
pub async fn update(
    State(state): State<AppState>,
    Operator(op): Operator,
    Path(id): Path<String>,
    JsonBody(patch): JsonBody<SchedulePatch>,
) -> Result<Json<Schedule>, ApiError> {
    let id = parse_id(&id)?;
    let mut db = state.pool.get().await.map_err(StoreError::from)?;
    // Params are the schedule's own task type's: ones it refuses conflict with the schedule.
    let changed =
        schedules::change(&mut db, &state.catalogue, id, patch, &op.name, Utc::now()).await.map_err(|e| match e {
            ScheduleError::Invalid { field, code: "invalid_params", message } => {
                ApiError::new(StatusCode::CONFLICT, "invalid_params", message).with("field", field)
            }
            other => ApiError::from(other),
        })?;
    Ok(Json(changed))
}

/// Delete a schedule (jobs it fired stay).
#[utoipa::path(delete, path = "/v1/admin/schedules/{id}", tag = "operations", params(("id" = String, Path)),
    security(("operator_key" = [])),
    responses((status = 401, body = ErrorBody), (status = 200, body = Deleted), (status = 404, body = ErrorBody)))]
pub async fn delete(
    State(state): State<AppState>,
    Operator(_): Operator,
    Path(id): Path<String>,
) -> Result<Json<Deleted>, ApiError> {
    let id = parse_id(&id)?;
    let db = state.pool.get().await.map_err(StoreError::from)?;
    if store::delete(&db, id).await? { Ok(Json(Deleted { deleted: id })) } else { Err(ApiError::not_found()) }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Deleted {
    pub deleted: Uuid,
}
