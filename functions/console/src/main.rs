//! The console function: polls each configured project's status contract and serves the
//! console page. Wiring only; the console is `taskdeck::console` (no database, no queue).

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    taskdeck::lambda::init_logging();
    let router = taskdeck::lambda::init(async { taskdeck::lambda::console::router_from_env() }).await?;
    lambda_http::run(router).await
}
