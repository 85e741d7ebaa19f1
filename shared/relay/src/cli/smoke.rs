//! `relay smoke`: right after a deploy, submit a `noop` job through the public API and wait
//! for it to succeed. Anything else within the bound (refused, failed, still pending because
//! no executor runs, API unreachable) exits non-zero with what was seen, so a deploy whose
//! executor cannot run work fails instead of succeeding quietly.

use std::time::{Duration, Instant};

use anyhow::bail;
use serde_json::{Value, json};
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
    let started = Instant::now();
    let bound = Duration::from_secs(s.within);
    let nonce = uuid::Uuid::now_v7();
    let request = json!({
        "task_type": "noop",
        "params": {"echo": format!("smoke {nonce}")},
        "correlation_id": format!("relay-smoke-{nonce}"),
        "max_attempts": 1,
    });
    let submitted =
        client.submit(&format!("relay-smoke-{nonce}"), &request).await.map_err(|e| anyhow::anyhow!("submit: {e}"))?;
    let id = submitted["id"].as_str().and_then(|i| i.parse().ok());
    let Some(id) = id else { bail!("submit: no job id in the answer: {submitted}") };
    eprintln!("relay smoke: job {id} submitted");
    let mut last: Value = submitted;
    loop {
        match last["status"].as_str() {
            Some("succeeded") => {
                println!("relay smoke: job {id} succeeded in {:.1} s", started.elapsed().as_secs_f64());
                return Ok(());
            }
            Some(status @ ("failed" | "cancelled")) => bail!("job {id} ended {status}: {last}"),
            _ => {}
        }
        if started.elapsed() >= bound {
            bail!(
                "job {id} did not succeed within {} s (is an executor running and reaching the queue?); last seen: {last}",
                s.within
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        last = match client.job(id).await {
            Ok(Some(job)) => job,
            Ok(None) => bail!("job {id} is not found after it was accepted"),
            Err(e) => bail!("reading job {id}: {e}"),
        };
    }
}
