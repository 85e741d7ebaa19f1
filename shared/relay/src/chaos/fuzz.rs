//! Scenario 10, API fuzzing: schemathesis (PyPI, in a venv of its own) against `relay serve`
//! and the OpenAPI document it serves, with each kind of key on its own routes (tenant key on
//! the tenant routes, operator key on `/v1/admin`, status key on `/v1/status`), every check
//! (`--checks all`: no 5xx, answers match their documented schema, status and content type, no
//! valid request refused), NUL characters allowed in what it draws, and a fresh Idempotency-Key
//! per request (a hook), so every submission is judged on its own body. Then every operation
//! with a path parameter is called with hostile bytes in each (NUL, not UTF-8, overlong, `%`,
//! path traversal): each must answer a JSON 4xx with a stable code.

use std::process::Stdio;

use super::harness;
use super::{Env, Report};
use taskdeck::platform::Settings;
use taskdeck::store::{operators, status_keys};

/// schemathesis hooks: a valid Idempotency-Key the case drew is replaced by a fresh one (an
/// invalid or missing key is sent as drawn, to be refused). A case that leaves out a required
/// header is not touched: schemathesis revalidates an edited case and would then send it with
/// the `Authorization` header it is meant to lack.
/// Schemathesis hooks (`__REFUSED__` is replaced by the header names a destination may not
/// use). A JSON Schema cannot say that two values differ: a destination's signature headers
/// are made distinct (from each other and from its auth header) and not ones Relay sets, so a
/// generated case stays one the document allows and the server takes (the rule itself has its
/// own tests: `tests/http_rules.rs`).
const HOOKS: &str = r#"import uuid

import schemathesis
from schemathesis.generation.meta import CoverageScenario, coverage_scenario

REFUSED = set(__REFUSED__)


def distinct_signature_headers(case):
    body = case.body
    if case.method.upper() != "PUT" or case.operation.path != "/v1/destinations/{name}" or not isinstance(body, dict):
        return
    scheme = body.get("signature")
    if not isinstance(scheme, dict):
        return
    auth = body.get("auth_header")
    seen = {auth.lower()} if isinstance(auth, str) else set()
    for field in ("signature_header", "timestamp_header", "id_header"):
        name = scheme.get(field)
        if not isinstance(name, str):
            continue
        n = 0
        while name.lower() in seen or name.lower() in REFUSED:
            n += 1
            name = "X-Fuzz-" + field.split("_")[0] + "-" + str(n)
        scheme[field] = name
        seen.add(name.lower())


@schemathesis.hook
def before_call(ctx, case, kwargs):
    if coverage_scenario(case) == CoverageScenario.MISSING_PARAMETER:
        return
    headers = case.headers
    key = (headers or {}).get("Idempotency-Key")
    if isinstance(key, str) and 1 <= len(key.strip()) <= 200 and all(33 <= ord(c) <= 126 for c in key.strip()):
        headers["Idempotency-Key"] = "fuzz-" + uuid.uuid4().hex
    distinct_signature_headers(case)
"#;

/// Schemathesis's configuration: 413 (over a route's body limit) is a refusal too.
const CONFIG: &str = r#"[checks.negative_data_rejection]
expected-statuses = ["400", "401", "403", "404", "405", "406", "409", "413", "415", "422", "428", "429", "5xx"]
"#;

/// Path parameter values (already percent-encoded) no route may answer with a 5xx or non-JSON.
const HOSTILE: [&str; 10] = [
    "%00",
    "a%00b%40example.com",
    "%FF",
    "%C3%28",
    "..%2F..%2Fetc%2Fpasswd",
    "%25",
    "%E2%80%AE",
    "-1",
    "00000000-0000-0000-0000-000000000000",
    "%20",
];

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("fuzz", env.scale);
    let examples = env.n(1000, 20);
    let tmp = env.tmp.clone();
    let venv = tokio::task::spawn_blocking(move || {
        crate::localaws::venv(&tmp.join("schemathesis-venv"), &["schemathesis>=4,<5"])
    })
    .await??;
    let scratch = env.scratch(Settings::default()).await?;
    let (operator_key, status_key) = {
        let db = scratch.platform.pool.get().await?;
        (operators::create(&db, "fuzz").await?.1, status_keys::create(&db, "fuzz").await?.1)
    };
    // A local secret store, as `relay dev` has, so `PUT /v1/destinations/{name}/secret` is tested, not 503.
    let secrets = env.tmp.join("fuzz-secrets");
    let env_vars = [("RELAY_LOG", "error".into()), ("RELAY_SECRETS_DIR", secrets.display().to_string())];
    let (server, http) = harness::serve(&env.relay, &scratch.url, &env_vars, &env.log("fuzz-serve")).await?;
    let runs = [
        (
            "tenant",
            scratch.key.as_str(),
            // Every tenant route: whatever is not the operators' or the status key's.
            "^/v1/(?!admin|status$|openapi\\.json$)",
        ),
        ("operator", operator_key.as_str(), "^/v1/admin"),
        ("status", status_key.as_str(), "^/(v1/status|v1/openapi.json|healthz)$"),
    ];
    let refused: Vec<&str> = taskdeck::destinations::REFUSED_HEADERS
        .iter()
        .chain(taskdeck::destinations::signature::OWN_HEADERS)
        .copied()
        .collect();
    std::fs::write(
        env.tmp.join("relay_fuzz_hooks.py"),
        HOOKS.replace("__REFUSED__", &serde_json::to_string(&refused)?),
    )?;
    std::fs::write(env.tmp.join("schemathesis.toml"), CONFIG)?;
    let mut total_failures = 0;
    for (who, key, paths) in runs {
        let out = tokio::process::Command::new(venv.join("bin/schemathesis"))
            .args(["--config-file", "schemathesis.toml", "run", &format!("{}/v1/openapi.json", http.base)])
            .args(["-H", &format!("Authorization: Bearer {key}")])
            .args(["--include-path-regex", paths, "-n", &examples.to_string(), "-c", "all", "--no-shrink"])
            .args(["--generation-allow-x00", "true"])
            .args(["--seed", "1", "--max-failures", "50", "--request-timeout", "20"])
            .current_dir(&env.tmp)
            .env("SCHEMATHESIS_TELEMETRY", "false")
            .env("SCHEMATHESIS_HOOKS", "relay_fuzz_hooks")
            .env("PYTHONPATH", &env.tmp)
            .stdin(Stdio::null())
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let cases = text.lines().find(|l| l.contains(" generated,")).unwrap_or("").trim().to_owned();
        let operations = text.lines().find(|l| l.trim_start().starts_with("Tested:")).unwrap_or("").trim().to_owned();
        let failures: Vec<&str> = text
            .lines()
            .filter(|l| {
                l.trim_start().starts_with("❌ ")
                    && !l.contains("Coverage")
                    && !l.contains("Fuzzing")
                    && !l.contains("Stateful")
                    && !l.contains("Examples")
            })
            .collect();
        let failed = !out.status.success();
        report.fig(&format!("{who} key ({paths}): operations"), operations);
        report.fig(&format!("{who} key: test cases"), cases);
        report.fig(&format!("{who} key: failures by check"), failures.iter().map(|l| l.trim()).collect::<Vec<_>>());
        if failed {
            total_failures += 1;
            let log = env.log(&format!("fuzz-{who}-report"));
            std::fs::write(&log, &text)?;
            report.check(false, format!("schemathesis ({who} key) failed; its report: {}", log.display()));
        }
    }
    report.fig("examples per operation (-n)", examples);
    let (probes, bad) = hostile_paths(&http, &scratch.key, &operator_key).await?;
    report.fig("hostile path-parameter probes", probes);
    report.fig("hostile probes answered 5xx or without a JSON error", bad.clone());
    report.check(bad.is_empty(), format!("{} hostile path probes were not a JSON 4xx: {bad:?}", bad.len()));
    report.fig("runs with failures", total_failures);
    let server_errors =
        server.log_text().matches("relay.api.internal").count() + server.log_text().matches("relay.api.panic").count();
    report.fig("server: internal errors / panics logged", server_errors);
    report.check(server_errors == 0, format!("the server logged {server_errors} internal errors"));
    drop(server);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}

/// Call every operation with a path parameter with each `HOSTILE` value in every parameter;
/// returns how many calls were made and those not answered with a JSON 4xx (or a 2xx).
async fn hostile_paths(
    http: &harness::Http,
    tenant_key: &str,
    operator_key: &str,
) -> anyhow::Result<(usize, Vec<String>)> {
    let (_, doc) = http.call("GET", "/v1/openapi.json", None, None, None).await?;
    let mut calls = 0;
    let mut bad = Vec::new();
    for (template, ops) in doc["paths"].as_object().into_iter().flatten().filter(|(p, _)| p.contains('{')) {
        let key = if template.starts_with("/v1/admin") { operator_key } else { tenant_key };
        for method in ops.as_object().into_iter().flat_map(|o| o.keys()) {
            for value in HOSTILE {
                let path = fill(template, value);
                let body = matches!(method.as_str(), "put" | "post" | "patch").then(|| serde_json::json!({}));
                let idem = format!("fuzz-probe-{calls}");
                let (status, answer) =
                    http.call(&method.to_uppercase(), &path, Some(key), Some(&idem), body.as_ref()).await?;
                calls += 1;
                let json_error = answer["error"]["code"].is_string();
                if status >= 500 || (status >= 400 && !json_error) {
                    bad.push(format!(
                        "{} {path}: {status} {}",
                        method.to_uppercase(),
                        answer.to_string().chars().take(120).collect::<String>()
                    ));
                }
            }
        }
    }
    Ok((calls, bad))
}

/// A path template with every `{param}` replaced by `value`.
fn fill(template: &str, value: &str) -> String {
    let mut out = String::new();
    let mut rest = template;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        rest = rest[open..].split_once('}').map_or("", |(_, r)| r);
        out.push_str(value);
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_path_parameter_is_filled() {
        assert_eq!(super::fill("/v1/jobs/{id}/recipients/{page}", "%00"), "/v1/jobs/%00/recipients/%00");
        assert_eq!(super::fill("/v1/tasks", "%00"), "/v1/tasks");
    }
}
