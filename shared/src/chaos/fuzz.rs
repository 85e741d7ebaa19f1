//! Scenario 10, API fuzzing: schemathesis (PyPI, in a venv of its own) against `relay serve`
//! and the OpenAPI document it serves, with each kind of key on its own routes (tenant key on
//! the tenant routes, operator key on `/v1/admin`, status key on `/v1/status`). Checks: no 5xx,
//! responses match their documented schema, status code and content type.

use std::process::Stdio;

use super::harness;
use super::{Env, Report};
use crate::platform::Settings;
use crate::store::{operators, status_keys};

const CHECKS: &str = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance";

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("fuzz", env.scale);
    let examples = env.n(1000, 20);
    let tmp = env.tmp.clone();
    let venv = tokio::task::spawn_blocking(move || crate::localaws::venv(&tmp.join("schemathesis-venv"), &["schemathesis>=4,<5"]))
        .await?
        .map_err(|e| anyhow::anyhow!(e))?;
    let scratch = env.scratch(Settings::default()).await?;
    let (operator_key, status_key) = {
        let db = scratch.platform.pool.get().await?;
        (operators::create(&db, "fuzz").await?.1, status_keys::create(&db, "fuzz").await?.1)
    };
    let (server, http) = harness::serve(&env.relay, &scratch.url, &[("RELAY_LOG", "error".into())], &env.log("fuzz-serve")).await?;
    let runs = [
        ("tenant", scratch.key.as_str(), "^/v1/(jobs|tasks|messages|templates|suppressions|sending-role|callbacks)"),
        ("operator", operator_key.as_str(), "^/v1/admin"),
        ("status", status_key.as_str(), "^/(v1/status|v1/openapi.json|healthz)$"),
    ];
    let mut total_failures = 0;
    for (who, key, paths) in runs {
        let out = tokio::process::Command::new(venv.join("bin/schemathesis"))
            .args(["run", &format!("{}/v1/openapi.json", http.base)])
            .args(["-H", &format!("Authorization: Bearer {key}")])
            .args(["-H", &format!("Idempotency-Key: fuzz-{who}")])
            .args(["--include-path-regex", paths, "-n", &examples.to_string(), "-c", CHECKS, "--no-shrink"])
            .args(["--seed", "1", "--max-failures", "50", "--request-timeout", "20"])
            .current_dir(&env.tmp)
            .env("SCHEMATHESIS_TELEMETRY", "false")
            .stdin(Stdio::null())
            .output()
            .await?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let cases = text.lines().find(|l| l.contains(" generated,")).unwrap_or("").trim().to_owned();
        let failures: Vec<&str> = text.lines().filter(|l| l.trim_start().starts_with("❌ ") && !l.contains("Coverage") && !l.contains("Fuzzing") && !l.contains("Stateful") && !l.contains("Examples")).collect();
        let failed = !out.status.success();
        report.fig(&format!("{who} key ({paths}): test cases"), cases);
        report.fig(&format!("{who} key: failure kinds"), failures.iter().map(|l| l.trim()).collect::<Vec<_>>());
        if failed {
            total_failures += 1;
            let log = env.log(&format!("fuzz-{who}-report"));
            std::fs::write(&log, &text)?;
            report.check(false, format!("schemathesis ({who} key) failed; its report: {}", log.display()));
        }
    }
    report.fig("examples per operation (-n)", examples);
    report.fig("runs with failures", total_failures);
    let server_errors = server.log_text().matches("relay.api.internal").count() + server.log_text().matches("relay.api.panic").count();
    report.fig("server: internal errors / panics logged", server_errors);
    report.check(server_errors == 0, format!("the server logged {server_errors} internal errors"));
    drop(server);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}
