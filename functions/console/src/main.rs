//! The console function: polls each configured project's status contract and serves the
//! console page. Wiring only; the console is the `relay-console` crate (no database, no queue,
//! no AWS SDK). Its projects come from `RELAY_CONSOLE_PROJECTS`; their tokens, when
//! `RELAY_CONSOLE_TOKENS_SECRET` names a secret, from Secrets Manager (read once per container).

use relay_console::ConsoleConfig;

/// The variable naming the tokens' secret: JSON `{"<project name>": "<token>"}`.
const TOKENS_SECRET: &str = "RELAY_CONSOLE_TOKENS_SECRET";

async fn config() -> anyhow::Result<ConsoleConfig> {
    let config = ConsoleConfig::from_env()?;
    let Some(secret) = std::env::var(TOKENS_SECRET).ok().filter(|s| !s.is_empty()) else { return Ok(config) };
    let sdk = aws_config::defaults(aws_config::BehaviorVersion::latest()).load().await;
    let got = aws_sdk_secretsmanager::Client::new(&sdk).get_secret_value().secret_id(&secret).send().await;
    let got =
        got.map_err(|e| anyhow::anyhow!("{TOKENS_SECRET}: {}", aws_sdk_secretsmanager::error::DisplayErrorContext(e)))?;
    let text = got.secret_string().ok_or_else(|| anyhow::anyhow!("{TOKENS_SECRET}: the secret has no string"))?;
    config.with_tokens(text, TOKENS_SECRET)
}

#[tokio::main]
async fn main() -> Result<(), lambda_http::Error> {
    relay_runtime::init_logging();
    let router = relay_runtime::init(async { relay_console::lambda::router(config().await?) }).await?;
    lambda_http::run(router).await
}
