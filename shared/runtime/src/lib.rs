//! What every Relay Lambda function does around its handler: JSON logs to stdout with the
//! Lambda Powertools fields, and an init that fails is reported to the Runtime API. Small on
//! purpose: the console function uses it without linking the platform (no Postgres, SES or STS).

mod powertools;
mod xray;

/// Run a function's init (its configuration, clients, pools). An error is also reported to the
/// Lambda Runtime API's `/init/error`, so the service shows it, naming the variable at fault, as
/// the reason the init failed (a `main` that just returns an error only exits the process).
pub async fn init<T>(setup: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    let err = match setup.await {
        Ok(v) => return Ok(v),
        Err(e) => e,
    };
    tracing::error!(event = "relay.lambda.init_failed", error = format!("{err:#}"), "init failed");
    if let Ok(api) = std::env::var("AWS_LAMBDA_RUNTIME_API")
        && let Err(e) = report_init_error(&api, &err).await
    {
        tracing::error!(
            event = "relay.lambda.init_report_failed",
            error = format!("{e:#}"),
            "could not report the init error"
        );
    }
    Err(err)
}

async fn report_init_error(api: &str, err: &anyhow::Error) -> anyhow::Result<()> {
    let body = serde_json::json!({ "errorMessage": format!("{err:#}"), "errorType": "Runtime.InitError" }).to_string();
    let req = hyper::Request::post(format!("http://{api}/2018-06-01/runtime/init/error"))
        .header("Lambda-Runtime-Function-Error-Type", "Runtime.InitError")
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(body)))?;
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build_http();
    let res = client.request(req).await?;
    anyhow::ensure!(res.status().is_success(), "the Runtime API answered {}", res.status());
    Ok(())
}

/// JSON logs to stdout (CloudWatch Logs, `LogFormat: JSON`); the filter from `RELAY_LOG`,
/// `info` by default. Each line is one flat object in the Lambda Powertools shape
/// (`powertools::Powertools`): `timestamp`, `level`, `message`, the event's own fields, the
/// fields of the spans it is inside (the job id and correlation id, `telemetry`), `service`,
/// `cold_start`, `function_request_id`, `xray_trace_id`.
///
/// With active tracing (`AWS_XRAY_DAEMON_ADDRESS` set), the outside calls also become X-Ray
/// subsegments of the function's segment (`xray`), whatever `RELAY_LOG` filters out of the logs.
pub fn init_logging() {
    use tracing_subscriber::prelude::*;
    let filter = tracing_subscriber::EnvFilter::try_from_env("RELAY_LOG").unwrap_or_else(|_| "info".into());
    let json = tracing_subscriber::fmt::format()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(true)
        .with_target(false);
    let logs = tracing_subscriber::fmt::layer()
        .fmt_fields(tracing_subscriber::fmt::format::JsonFields::new())
        .event_format(powertools::Powertools::from_env(json))
        .with_filter(filter);
    let traces =
        xray::XRay::from_env().map(|x| x.with_filter(tracing_subscriber::filter::filter_fn(xray::XRay::wants)));
    let _ = tracing_subscriber::registry().with(logs).with(traces).try_init();
}

/// An error with its sources, `outer: inner: innermost` (what an HTTP client's error hides).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}
