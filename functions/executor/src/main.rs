//! The executor function: SQS work messages → claim, run, record. Wiring only; the handler
//! is `taskdeck::lambda::executor::handle` (partial batch responses).

use aws_lambda_events::sqs::{SqsBatchResponse, SqsEvent};
use lambda_runtime::{Error, LambdaEvent, service_fn};
use taskdeck::config::LambdaConfig;

#[tokio::main]
async fn main() -> Result<(), Error> {
    relay_runtime::init_logging();
    let platform = relay_runtime::init(async { taskdeck::lambda::platform(&LambdaConfig::from_env()?).await }).await?;
    let exec = platform.executor();
    let live = platform.liveness(taskdeck::liveness::Kind::Executor);
    let (exec, live) = (&exec, &live);
    lambda_runtime::run(service_fn(move |event: LambdaEvent<SqsEvent>| async move {
        live.touch().await;
        Ok::<SqsBatchResponse, Error>(
            taskdeck::lambda::executor::handle(exec, event.payload, Some(event.context.deadline())).await,
        )
    }))
    .await
}
