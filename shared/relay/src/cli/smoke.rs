//! `relay smoke`: right after a deploy, submit a `noop` job through the public API and wait
//! for it to succeed (`taskdeck::smoke`, the same check the pre-traffic hook runs against the
//! new versions). Anything else within the bound (refused, failed, still pending because no
//! executor runs, API unreachable) exits non-zero with what was seen, so a deploy whose
//! executor cannot run work fails instead of succeeding quietly.

use std::time::Duration;

use taskdeck::client::Client;

#[derive(clap::Args)]
pub struct Smoke {
    /// The API's base URL (the stack's `ApiUrl` output).
    #[arg(long, env = "RELAY_API_URL")]
    url: String,
    /// A tenant's API key.
    #[arg(long, env = "RELAY_API_KEY", hide_env_values = true)]
    key: String,
    /// Seconds the job has to succeed.
    #[arg(long, default_value_t = 60)]
    within: u64,
}

pub async fn run(s: Smoke) -> anyhow::Result<()> {
    let client = Client::new(&s.url, &s.key)?;
    let done = taskdeck::smoke::run(&client, Duration::from_secs(s.within), Duration::from_millis(500)).await?;
    println!("relay smoke: job {} succeeded in {:.1} s", done.id, done.took.as_secs_f64());
    Ok(())
}
