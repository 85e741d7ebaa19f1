//! The intake function: API Gateway (HTTP API) → the very same axum router as `relay serve`.
//! Wiring only; the router lives in `taskdeck::api`.

use taskdeck::config::LambdaConfig;

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    relay_runtime::init_logging();
    // Read once per container; an error names the variable and fails the init phase. One pool
    // of one connection and the SQS client; nothing connects until the first request.
    let platform = relay_runtime::init(async { taskdeck::lambda::platform(&LambdaConfig::from_env()?).await }).await?;
    let live = platform.liveness(taskdeck::liveness::Kind::Api);
    let router = taskdeck::liveness::track(taskdeck::api::router(platform.app_state()), live);
    // Each request's metrics (accepted, refused, 5xx, database errors) in EMF.
    lambda_http::run(router.layer(axum::middleware::from_fn(taskdeck::metrics::emf::http))).await
}
