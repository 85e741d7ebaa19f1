//! The pre-traffic hook: CodeDeploy invokes it before shifting traffic to a deployment's new
//! versions; it migrates, runs a job through the new intake and executor, and reports the
//! verdict. Wiring only; the logic is `taskdeck::lambda::pretraffic`.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use taskdeck::config::LambdaConfig;
use taskdeck::lambda::pretraffic::{PreTraffic, Verdict};

#[tokio::main]
async fn main() -> Result<(), Error> {
    relay_runtime::init_logging();
    let hook = relay_runtime::init(async {
        let cfg = LambdaConfig::from_env()?;
        let platform = taskdeck::lambda::platform(&cfg).await?;
        Ok(PreTraffic::new(&cfg, platform, &taskdeck::lambda::sdk_config(&cfg).await)?)
    })
    .await?;
    let hook = &hook;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        Ok::<Verdict, Error>(hook.handle(&event.payload).await?)
    }))
    .await
}
