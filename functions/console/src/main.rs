//! The console function: a placeholder that deploys on its own (no database, no queue).
//! Its content arrives with the console issue; the router is `taskdeck::lambda::console`.

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    taskdeck::lambda::init_logging();
    lambda_http::run(taskdeck::lambda::console::router()).await
}
