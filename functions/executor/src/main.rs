//! The executor function: SQS work messages → claim, run, record (and the pre-traffic hook's
//! check job). Wiring only; the handler is `taskdeck::lambda::executor::handle_event`.

use lambda_runtime::{Diagnostic, Error, LambdaEvent, service_fn};
use taskdeck::config::LambdaConfig;

#[tokio::main]
async fn main() -> Result<(), Error> {
    relay_runtime::init_logging();
    let platform = relay_runtime::init(async { taskdeck::lambda::platform(&LambdaConfig::from_env()?).await }).await?;
    let exec = platform.executor();
    let live = platform.liveness(taskdeck::liveness::Kind::Executor);
    let (exec, live) = (&exec, &live);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<serde_json::Value>| async move {
        live.touch().await;
        taskdeck::lambda::executor::handle_event(exec, event.payload, Some(event.context.deadline()))
            .await
            .map_err(|e| Diagnostic { error_type: "Relay.BadEvent".into(), error_message: e.to_string() })
    }))
    .await
}
