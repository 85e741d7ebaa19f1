//! The OpenAPI 3.1 document of the whole API, generated from the handlers' annotations so it
//! cannot drift. Served at `/v1/openapi.json`; checked in as `shared/openapi.json` (a test
//! fails when the two differ; regenerate with `relay openapi > shared/openapi.json`).

use axum::Json;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{admin, callbacks, email, jobs, schedules, status};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Relay",
        version = "1.0.0",
        description = "Relay runs background work for client services. Tenant routes take \
            `Authorization: Bearer <tenant API key>`; `/v1/admin` routes take an operator key. \
            Every error is `{\"error\": {\"code\", \"message\", ...}}` with a stable `code`."
    ),
    paths(
        jobs::submit, jobs::submit_batch, jobs::list, jobs::get, jobs::events, jobs::sessions, jobs::cancel, jobs::tasks,
        email::list_messages, email::get_message, email::list_suppressions, email::add_suppression,
        email::remove_suppression, email::list_templates, email::get_template, email::put_template,
        email::delete_template, email::get_identities, email::put_identities, email::put_recipients,
        email::get_sending_role, email::put_sending_role,
        admin::list_exceptions, admin::show_exception, admin::retry, admin::cancel, admin::finish,
        admin::ignore, admin::bulk, admin::list_tenant_faults, admin::get_modes, admin::set_mode,
        schedules::list, schedules::create, schedules::get, schedules::update, schedules::delete,
        callbacks::get, callbacks::put, callbacks::rotate, callbacks::delete, callbacks::attempts,
        status::status, healthz, openapi_json,
    ),
    modifiers(&Keys),
    tags(
        (name = "jobs", description = "Submit and follow jobs (tenant key)"),
        (name = "email", description = "Messages and their events, suppressions, templates (tenant key)"),
        (name = "callbacks", description = "Signed callbacks: settings, rotation, delivery attempts (tenant key)"),
        (name = "operations", description = "Exceptions, modes and schedules (operator key)"),
        (name = "meta", description = "Health and this document"),
    )
)]
pub struct ApiDoc;

struct Keys;

impl Modify for Keys {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let components = doc.components.get_or_insert_with(Default::default);
        for name in ["tenant_key", "operator_key", "status_key"] {
            components.add_security_scheme(
                name,
                SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
            );
        }
    }
}

/// The document as pretty JSON with a final newline (the checked-in file's exact text).
pub fn document_json() -> String {
    let mut s = ApiDoc::openapi().to_pretty_json().unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

#[derive(serde::Serialize, utoipa::ToSchema)]
pub struct Health {
    pub ok: bool,
}

/// Liveness: answers without touching the database.
#[utoipa::path(get, path = "/healthz", tag = "meta", responses((status = 200, body = Health)))]
pub async fn healthz() -> Json<Health> {
    Json(Health { ok: true })
}

/// This document.
#[utoipa::path(get, path = "/v1/openapi.json", tag = "meta", responses((status = 200, description = "the OpenAPI 3.1 document")))]
pub async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    Json(ApiDoc::openapi())
}
