//! `POST /v1/jobs/{id}/complete`: an outside party's completion of a job waiting for it,
//! presented with the token its task handed out (`TaskContext::await_completion`). Applied
//! once (`crate::completions`): the same completion again is answered 200 with `applied`
//! false and changes nothing; another one is 409 `already_completed`, naming the outcome
//! recorded. Another tenant's job answers 404, as every job route does.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use serde::Serialize;
use utoipa::ToSchema;

use super::AppState;
use super::error::{ApiError, ErrorBody};
use super::extract::{Caller, JsonBody};
use crate::completions::{self, Applied, CompletionRequest, Via};
use crate::job::completion::CompletionOutcome;
use crate::store::{StoreError, jobs};
use crate::view::{self, JobView};

/// The answer: the job as it now stands, and whether this request changed it.
#[derive(Debug, Serialize, ToSchema)]
pub struct CompletionAnswer {
    /// True when this request ended the wait; false for a replay of the completion applied
    /// before (nothing changed).
    pub applied: bool,
    pub outcome: CompletionOutcome,
    pub job: JobView,
}

/// `POST /v1/jobs/{id}/complete`
#[utoipa::path(post, path = "/v1/jobs/{id}/complete", tag = "jobs", params(("id" = String, Path)),
    request_body = CompletionRequest, security(("tenant_key" = [])),
    responses((status = 200, description = "applied (`applied` true), or a replay of the completion applied before (`applied` false; nothing changed)", body = CompletionAnswer),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 403, description = "`invalid_token`: no wait of this job has this token", body = ErrorBody),
        (status = 404, description = "no such job for this tenant", body = ErrorBody),
        (status = 409, description = "`already_completed` (another completion was applied: `outcome`, `completed_at`), `completion_overdue` (the deadline passed and the sweep applied the overdue policy: `deadline`, `on_overdue`, `handled_at`) or `wait_superseded` (the job left the attempt this token was for)", body = ErrorBody),
        (status = 413, body = ErrorBody), (status = 422, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn complete(
    State(state): State<AppState>,
    Caller(tenant): Caller,
    Path(id): Path<String>,
    JsonBody(req): JsonBody<CompletionRequest>,
) -> Result<Json<CompletionAnswer>, ApiError> {
    let id = super::jobs::parse_id(&id)?;
    let (token, c) = req
        .into_completion()
        .map_err(|e| ApiError::unprocessable("invalid_field", e.message).with("field", e.field))?;
    // Another tenant's job answers like a missing one, whatever token came with it.
    super::jobs::owned(&state.pool.get().await.map_err(StoreError::from)?, tenant.id, id).await?;
    let applied =
        completions::apply(&state.pool, &state.transport, &token, Some((tenant.id, id)), &c, Via::Api).await?;
    let answer = |applied: bool, outcome| async move {
        let db = state.pool.get().await.map_err(StoreError::from)?;
        let job = jobs::get(&db, tenant.id, id).await?.ok_or_else(ApiError::not_found)?;
        Ok::<_, ApiError>(Json(CompletionAnswer {
            applied,
            outcome,
            job: view::annotate_one(&db, job, chrono::Utc::now()).await?,
        }))
    };
    match applied {
        Applied::Applied { outcome, .. } => answer(true, outcome).await,
        Applied::Replayed { outcome, .. } => answer(false, outcome).await,
        Applied::AlreadyCompleted { outcome, at, .. } => Err(conflict(
            "already_completed",
            format!("the job was already completed ({}); a completion applies once", outcome.as_str()),
        )
        .with("outcome", outcome.as_str())
        .with("completed_at", at.to_rfc3339())),
        Applied::Overdue { deadline, policy, at, .. } => Err(conflict(
            "completion_overdue",
            format!(
                "the deadline {} passed with no completion, and the overdue policy ({}) was applied",
                deadline.to_rfc3339(),
                policy.as_str()
            ),
        )
        .with("deadline", deadline.to_rfc3339())
        .with("on_overdue", policy.as_str())
        .with("handled_at", at.to_rfc3339())),
        Applied::Superseded { .. } => Err(conflict(
            "wait_superseded",
            "the job has left the attempt this token was for (cancelled, or another attempt runs)",
        )),
        Applied::UnknownToken => {
            Err(ApiError::new(StatusCode::FORBIDDEN, "invalid_token", "this token does not complete this job")
                .with("field", "token"))
        }
    }
}

fn conflict(code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, code, message)
}
