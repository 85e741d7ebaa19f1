//! The OpenAPI 3.1 document of the whole API, generated from the handlers' annotations so it
//! cannot drift. Served at `/v1/openapi.json`; checked in as `shared/openapi.json` (a test
//! fails when the two differ; regenerate with `relay openapi > shared/openapi.json`).

use axum::Json;
use serde_json::{Value, json};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use super::{
    admin, callbacks, completions, cutover, destinations, email, jobs, limits, reputation, schedules, send_rates,
    status, submit, topics,
};
use crate::pattern::NO_NUL;

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
        submit::submit, submit::submit_batch, jobs::list, jobs::get, jobs::events, jobs::sessions, jobs::cancel, jobs::tasks,
        completions::complete,
        email::list_messages, email::get_message, email::message_events, email::list_suppressions, email::add_suppression,
        email::remove_suppression, email::list_templates, email::get_template, email::put_template,
        email::delete_template, email::get_identities, email::put_identities, email::put_recipients,
        email::get_sending_role, email::put_sending_role,
        topics::list, topics::put, topics::delete, topics::put_ses, topics::list_ses, topics::delete_ses,
        admin::list_exceptions, admin::show_exception, admin::retry, admin::cancel, admin::finish,
        admin::ignore, admin::bulk, admin::list_tenant_faults, admin::get_modes, admin::set_mode,
        send_rates::list, send_rates::get, send_rates::put, send_rates::put_weight,
        schedules::list, schedules::create, schedules::get, schedules::update, schedules::delete,
        callbacks::get, callbacks::put, callbacks::rotate, callbacks::delete, callbacks::attempts,
        destinations::list, destinations::get, destinations::put, destinations::delete, destinations::put_secret,
        destinations::put_signing_secret, destinations::put_client_secret, destinations::put_refresh_token,
        destinations::put_writes, destinations::calls,
        limits::own, limits::get, limits::put,
        reputation::own, reputation::get, reputation::put, reputation::resume,
        cutover::own, cutover::list, cutover::put,
        status::status, healthz, openapi_json,
    ),
    components(schemas(admin::ExceptionStatus)),
    modifiers(&Keys),
    tags(
        (name = "jobs", description = "Submit and follow jobs (tenant key)"),
        (name = "email", description = "Messages and their events, suppressions, templates (tenant key)"),
        (name = "callbacks", description = "Signed callbacks: settings, rotation, delivery attempts (tenant key)"),
        (name = "destinations", description = "HTTP destinations `http.request` and `webhook.send` call, their secrets and write switches, each job's calls (tenant key)"),
        (name = "limits", description = "The caller's own limits on the rows it creates, and what it uses (tenant key)"),
        (name = "operations", description = "Exceptions, modes, schedules, send rates and tenants' limits (operator key)"),
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
    let mut s = serde_json::to_string_pretty(&document()).unwrap_or_else(|_| "{}".into());
    s.push('\n');
    s
}

/// The document, with the rules the server applies to every route written in where they apply:
/// no string it takes (parameter or request body field, at any depth) may hold a NUL character,
/// every operation with a path or query parameter may answer 400 (`extract::check_uri`), and
/// every operation with a body 413 (over the route's body limit, `extract::JsonBody`).
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    super::constraints::apply(&mut doc);
    let error = |description: &str| {
        json!({"description": description,
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}})
    };
    let bad_request = error("a path or query parameter the server refuses (a NUL character, not UTF-8)");
    let too_large = error("the body is over the route's size limit (`body_too_large`)");
    let mut refs = Vec::new();
    for op in doc["paths"]
        .as_object_mut()
        .into_iter()
        .flat_map(|p| p.values_mut())
        .filter_map(Value::as_object_mut)
        .flat_map(|m| m.values_mut())
    {
        let has_params =
            op["parameters"].as_array().is_some_and(|ps| ps.iter().any(|p| p["in"] == "path" || p["in"] == "query"));
        if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut)
            && has_params
            && !responses.contains_key("400")
        {
            responses.insert("400".into(), bad_request.clone());
        }
        let has_body = op.get("requestBody").is_some();
        if let Some(responses) = op.get_mut("responses").and_then(Value::as_object_mut)
            && has_body
            && !responses.contains_key("413")
        {
            responses.insert("413".into(), too_large.clone());
        }
        for part in ["parameters", "requestBody"] {
            if let Some(v) = op.get_mut(part) {
                collect_refs(v, &mut refs);
                super::constraints::any_is_json(v);
                no_nul_strings(v);
            }
        }
    }
    // The schemas request bodies name, and those they name in turn.
    let mut seen = std::collections::BTreeSet::new();
    while let Some(name) = refs.pop() {
        if seen.insert(name.clone())
            && let Some(schema) = doc["components"]["schemas"].get_mut(&name)
        {
            collect_refs(schema, &mut refs);
            super::constraints::any_is_json(schema);
            no_nul_strings(schema);
        }
    }
    doc
}

/// The component schema names a value refers to (`$ref: #/components/schemas/<name>`).
fn collect_refs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(map) => {
            if let Some(name) =
                map.get("$ref").and_then(Value::as_str).and_then(|r| r.strip_prefix("#/components/schemas/"))
            {
                out.push(name.to_owned());
            }
            map.values().for_each(|x| collect_refs(x, out));
        }
        Value::Array(items) => items.iter().for_each(|x| collect_refs(x, out)),
        _ => {}
    }
}

/// Give every string schema without a pattern, format or enum the `NO_NUL` pattern.
fn no_nul_strings(v: &mut Value) {
    match v {
        Value::Object(map) => {
            let is_string = match map.get("type") {
                Some(Value::String(t)) => t == "string",
                Some(Value::Array(ts)) => ts.iter().any(|t| t == "string"),
                _ => false,
            };
            if is_string && !["pattern", "format", "enum", "const"].iter().any(|k| map.contains_key(*k)) {
                map.insert("pattern".into(), NO_NUL.into());
            }
            map.values_mut().for_each(no_nul_strings);
        }
        Value::Array(items) => items.iter_mut().for_each(no_nul_strings),
        _ => {}
    }
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
pub async fn openapi_json() -> Json<Value> {
    Json(document())
}
