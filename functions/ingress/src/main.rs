//! The ingress function: provider queues (SES events via SNS, inbound mail) → jobs. Wiring
//! only; the handler is `taskdeck::lambda::ingress::Ingress::handle`.

use lambda_runtime::{Diagnostic, Error, LambdaEvent, service_fn};
use taskdeck::config::LambdaConfig;
use taskdeck::lambda::ingress::Ingress;

#[tokio::main]
async fn main() -> Result<(), Error> {
    relay_runtime::init_logging();
    let (cfg, platform) = relay_runtime::init(async {
        let cfg = LambdaConfig::from_env()?;
        let platform = taskdeck::lambda::platform(&cfg).await?;
        Ok((cfg, platform))
    })
    .await?;
    let ingress = Ingress::new(&platform, &cfg.ingress_tenant);
    let live = platform.liveness(taskdeck::liveness::Kind::Ingress);
    let (ingress, live) = (&ingress, &live);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        live.touch().await;
        ingress
            .handle_event(event.payload)
            .await
            .map_err(|e| Diagnostic { error_type: "Relay.BadEvent".into(), error_message: e.to_string() })
    }))
    .await
}
