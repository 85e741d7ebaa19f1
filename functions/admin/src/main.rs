//! The admin function: operator actions from inside the VPC, invoked with `aws lambda invoke`
//! (migrate, create tenants, operators and status keys, redrive a dead-letter queue), each
//! audited. Wiring only; the logic is `taskdeck::lambda::admin`.

use lambda_runtime::{Error, LambdaEvent, service_fn};
use taskdeck::config::LambdaConfig;
use taskdeck::lambda::admin::Admin;

#[tokio::main]
async fn main() -> Result<(), Error> {
    relay_runtime::init_logging();
    let admin = relay_runtime::init(async {
        let cfg = LambdaConfig::from_env()?;
        let platform = taskdeck::lambda::platform(&cfg).await?;
        Ok(Admin::new(&cfg, platform, &taskdeck::lambda::sdk_config(&cfg).await))
    })
    .await?;
    let admin = &admin;
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        Ok::<_, Error>(admin.handle(&event.payload, Some(&event.context.request_id)).await)
    }))
    .await
}
