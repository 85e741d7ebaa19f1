//! The sweeper function: an EventBridge schedule → sweep passes (the maintenance services,
//! `taskdeck::maintenance`). Wiring only; the handler is `taskdeck::lambda::sweeper::handle`.

use lambda_runtime::{Diagnostic, Error, LambdaEvent, service_fn};
use taskdeck::config::LambdaConfig;
use taskdeck::maintenance::SweepReport;

#[tokio::main]
async fn main() -> Result<(), Error> {
    relay_runtime::init_logging();
    let (cfg, platform) = relay_runtime::init(async {
        let cfg = LambdaConfig::from_env()?;
        let platform = taskdeck::lambda::platform(&cfg).await?;
        Ok((cfg, platform))
    })
    .await?;
    let sweeper = platform.sweeper();
    let live = platform.liveness(taskdeck::liveness::Kind::Sweeper);
    let (sweeper, cfg, live) = (&sweeper, &cfg, &live);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        live.touch().await;
        // A failed pass fails the invocation, named for what it is (not the boxed error's type).
        let reports: Vec<SweepReport> =
            taskdeck::lambda::sweeper::handle(sweeper, &event.payload, cfg.sweep_passes, cfg.sweep_gap).await.map_err(
                |e| Diagnostic {
                    error_type: "Relay.SweepFailed".into(),
                    error_message: format!("sweep pass failed: {e}"),
                },
            )?;
        Ok::<_, Diagnostic>(reports)
    }))
    .await
}
