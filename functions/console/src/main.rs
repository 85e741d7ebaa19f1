//! The console function: polls each configured project's status contract and serves the
//! console page. Wiring only; the console is the `relay-console` crate (no database, no queue, no AWS SDK).

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    relay_runtime::init_logging();
    let router = relay_runtime::init(async { relay_console::lambda::router_from_env() }).await?;
    lambda_http::run(router).await
}
