//! The pre-traffic hook: before CodeDeploy shifts any traffic to a deployment's new versions,
//! migrate the database, then run the smoke check (`crate::smoke`) through the **new** intake
//! version (invoked directly, with API Gateway's event shape) and hand the job to the **new**
//! executor version (invoked directly, with the SQS event the queue would deliver), and wait
//! for the job to succeed. The verdict goes to CodeDeploy
//! (`PutLifecycleEventHookExecutionStatus`): `Failed` stops the deployment and CloudFormation
//! rolls the stack back. Invoked by hand (any payload without a `DeploymentId`, e.g. after a
//! stack's first deploy, when CodeDeploy runs no hook), a failed check fails the invocation.
//!
//! Every Lambda and CodeDeploy call Relay makes lives in this file.

use std::time::Duration;

use aws_sdk_codedeploy::types::LifecycleEventStatus;
use aws_sdk_lambda::error::DisplayErrorContext;
use aws_sdk_lambda::primitives::Blob;
use base64::Engine;
use serde::Serialize;
use serde_json::{Value, json};

use crate::client::ClientError;
use crate::config::LambdaConfig;
use crate::job::JobId;
use crate::platform::Platform;
use crate::smoke::{self, SmokeApi, SmokeError};
use crate::store::{StoreError, tenants};
use crate::transport::sqs::WorkMessage;

/// The tenant the hook's jobs belong to (created on first use; its key is replaced each run).
pub const TENANT: &str = "relay-deploy-check";

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckFailed {
    #[error("migrations: {0}")]
    Migrate(anyhow::Error),
    #[error("the deploy-check tenant: {0}")]
    Tenant(StoreError),
    #[error(transparent)]
    Smoke(#[from] SmokeError),
}

/// What the hook did and found; also its answer.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub passed: bool,
    pub migrations_applied: Vec<String>,
    pub job_id: Option<JobId>,
    pub seconds: f64,
    pub reason: Option<String>,
    /// CodeDeploy's ids when CodeDeploy invoked the hook.
    pub deployment_id: Option<String>,
}

/// The hook's reporting to CodeDeploy failed (the deployment then times out and fails).
#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("could not report {status} to CodeDeploy for deployment {deployment}: {error}")]
    Report { deployment: String, status: &'static str, error: String },
    #[error("the deploy check failed: {0}")]
    Failed(String),
    #[error("{0} is not set")]
    Missing(&'static str),
}

/// The new versions to check, and the clients that reach them.
pub struct PreTraffic {
    platform: Platform,
    lambda: aws_sdk_lambda::Client,
    codedeploy: aws_sdk_codedeploy::Client,
    intake: String,
    executor: String,
    within: Duration,
    retention_days: u32,
}

impl PreTraffic {
    /// `intake`/`executor` from `RELAY_PRETRAFFIC_INTAKE`/`RELAY_PRETRAFFIC_EXECUTOR` (a
    /// function name, or a version's ARN as the template passes). The Lambda and CodeDeploy
    /// endpoints follow `AWS_ENDPOINT_URL_LAMBDA`/`AWS_ENDPOINT_URL_CODEDEPLOY` when set.
    pub fn new(cfg: &LambdaConfig, platform: Platform, sdk: &aws_config::SdkConfig) -> Result<Self, HookError> {
        let mut lambda = aws_sdk_lambda::config::Builder::from(sdk);
        if let Some(url) = &cfg.lambda_endpoint_url {
            lambda = lambda.endpoint_url(url);
        }
        let mut codedeploy = aws_sdk_codedeploy::config::Builder::from(sdk);
        if let Some(url) = &cfg.codedeploy_endpoint_url {
            codedeploy = codedeploy.endpoint_url(url);
        }
        Ok(Self {
            platform,
            lambda: aws_sdk_lambda::Client::from_conf(lambda.build()),
            codedeploy: aws_sdk_codedeploy::Client::from_conf(codedeploy.build()),
            intake: cfg.pretraffic_intake.clone().ok_or(HookError::Missing("RELAY_PRETRAFFIC_INTAKE"))?,
            executor: cfg.pretraffic_executor.clone().ok_or(HookError::Missing("RELAY_PRETRAFFIC_EXECUTOR"))?,
            within: cfg.pretraffic_within,
            retention_days: cfg.retention_days,
        })
    }

    /// One invocation: check, then report to CodeDeploy when it asked.
    pub async fn handle(&self, event: &Value) -> Result<Verdict, HookError> {
        let started = std::time::Instant::now();
        let deployment = event["DeploymentId"].as_str().map(str::to_owned);
        let execution = event["LifecycleEventHookExecutionId"].as_str().map(str::to_owned);
        let mut verdict = Verdict {
            passed: false,
            migrations_applied: Vec::new(),
            job_id: None,
            seconds: 0.0,
            reason: None,
            deployment_id: deployment.clone(),
        };
        match self.check(&mut verdict).await {
            Ok(()) => verdict.passed = true,
            Err(e) => verdict.reason = Some(e.to_string()),
        }
        verdict.seconds = started.elapsed().as_secs_f64();
        tracing::info!(
            event = "relay.pretraffic.verdict",
            passed = verdict.passed,
            deployment_id = deployment.as_deref(),
            job_id = verdict.job_id.map(|j| j.to_string()),
            reason = verdict.reason.as_deref(),
            seconds = verdict.seconds,
            intake = self.intake,
            executor = self.executor,
            "deploy check done"
        );
        crate::metrics::emf::record(&[("DeployCheckFailed", f64::from(u8::from(!verdict.passed)))]);
        match (deployment, execution) {
            (Some(deployment), Some(execution)) => {
                let status =
                    if verdict.passed { LifecycleEventStatus::Succeeded } else { LifecycleEventStatus::Failed };
                let name = if verdict.passed { "Succeeded" } else { "Failed" };
                self.codedeploy
                    .put_lifecycle_event_hook_execution_status()
                    .deployment_id(&deployment)
                    .lifecycle_event_hook_execution_id(execution)
                    .status(status)
                    .send()
                    .await
                    .map_err(|e| HookError::Report {
                        deployment,
                        status: name,
                        error: DisplayErrorContext(e).to_string(),
                    })?;
                Ok(verdict)
            }
            _ if verdict.passed => Ok(verdict),
            _ => Err(HookError::Failed(verdict.reason.unwrap_or_default())),
        }
    }

    async fn check(&self, verdict: &mut Verdict) -> Result<(), CheckFailed> {
        let applied = super::admin::migrate(&self.platform, self.retention_days).await.map_err(CheckFailed::Migrate)?;
        verdict.migrations_applied = applied.into_iter().map(str::to_owned).collect();
        let key = async {
            let db = self.platform.pool.get().await?;
            let tenant = tenants::ensure(&db, TENANT).await?;
            tenants::rotate_key(&db, tenant.id).await
        };
        let key = key.await.map_err(CheckFailed::Tenant)?;
        let versions = NewVersions { hook: self, key };
        let done = smoke::run(&versions, self.within, Duration::from_millis(250)).await;
        verdict.job_id = match &done {
            Ok(d) => Some(d.id),
            Err(SmokeError::Ended { id, .. } | SmokeError::TimedOut { id, .. } | SmokeError::Vanished(id)) => Some(*id),
            Err(_) => None,
        };
        done?;
        Ok(())
    }

    /// Invoke a function (synchronously) with a JSON event: its answer, or why there is none.
    async fn invoke(&self, function: &str, event: &Value) -> Result<Value, String> {
        let out = self
            .lambda
            .invoke()
            .function_name(function)
            .payload(Blob::new(event.to_string()))
            .send()
            .await
            .map_err(|e| format!("invoking {function}: {}", DisplayErrorContext(e)))?;
        let payload = out.payload().map(|b| String::from_utf8_lossy(b.as_ref()).into_owned()).unwrap_or_default();
        if let Some(kind) = out.function_error() {
            return Err(format!("{function} failed ({kind}): {payload}"));
        }
        serde_json::from_str(&payload).map_err(|e| format!("{function} answered what is not JSON ({e}): {payload}"))
    }
}

/// The API as the new intake version serves it, and the new executor version behind it.
struct NewVersions<'a> {
    hook: &'a PreTraffic,
    key: String,
}

impl NewVersions<'_> {
    /// One request through the new intake, as API Gateway's HTTP API (payload 2.0) sends it.
    async fn call(
        &self,
        method: &str,
        path: &str,
        idem: Option<&str>,
        body: Option<&Value>,
    ) -> Result<(u16, Vec<u8>), ClientError> {
        let mut headers = json!({"authorization": format!("Bearer {}", self.key), "accept": "application/json"});
        if let Some(k) = idem {
            headers["idempotency-key"] = json!(k);
        }
        if body.is_some() {
            headers["content-type"] = json!("application/json");
        }
        let event = json!({
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": path,
            "rawQueryString": "",
            "headers": headers,
            "requestContext": {
                "accountId": "relay", "apiId": "relay-deploy-check", "domainName": "relay-deploy-check",
                "http": {"method": method, "path": path, "protocol": "HTTP/1.1", "sourceIp": "127.0.0.1",
                         "userAgent": "relay-pretraffic"},
                "requestId": uuid::Uuid::now_v7().to_string(), "routeKey": "$default", "stage": "$default",
                "timeEpoch": chrono::Utc::now().timestamp_millis(),
            },
            "body": body.map(Value::to_string),
            "isBase64Encoded": false,
        });
        let answer = self.hook.invoke(&self.hook.intake, &event).await.map_err(ClientError::Http)?;
        let status = answer["statusCode"].as_u64().and_then(|s| u16::try_from(s).ok());
        let Some(status) = status else { return Err(ClientError::Decode(format!("no statusCode in {answer}"))) };
        let text = answer["body"].as_str().unwrap_or_default();
        let bytes = if answer["isBase64Encoded"] == true {
            base64::engine::general_purpose::STANDARD.decode(text).map_err(|e| ClientError::Decode(e.to_string()))?
        } else {
            text.as_bytes().to_vec()
        };
        Ok((status, bytes))
    }
}

fn decode(status: u16, body: &[u8]) -> Result<Value, ClientError> {
    match status {
        200..=299 => serde_json::from_slice(body).map_err(|e| ClientError::Decode(e.to_string())),
        _ => Err(ClientError::Status { status, body: String::from_utf8_lossy(body).into_owned() }),
    }
}

#[async_trait::async_trait]
impl SmokeApi for NewVersions<'_> {
    async fn submit(&self, idempotency_key: &str, request: &Value) -> Result<Value, ClientError> {
        let (status, body) = self.call("POST", "/v1/jobs", Some(idempotency_key), Some(request)).await?;
        decode(status, &body)
    }

    async fn job(&self, id: JobId) -> Result<Option<Value>, ClientError> {
        match self.call("GET", &format!("/v1/jobs/{id}"), None, None).await? {
            (404, _) => Ok(None),
            (status, body) => decode(status, &body).map(Some),
        }
    }

    /// Hand the job to the new executor as the work queue would: one SQS record carrying its
    /// work message. The executor must answer with no record returned.
    async fn submitted(&self, job: &Value) -> Result<(), SmokeError> {
        let id = job["id"].as_str().and_then(|i| i.parse::<JobId>().ok());
        let Some(job_id) = id else { return Err(SmokeError::NoId(job.clone())) };
        let run_at = job["run_at"].as_str().and_then(|t| t.parse().ok()).unwrap_or_else(chrono::Utc::now);
        let body =
            serde_json::to_string(&WorkMessage { job_id, run_at }).map_err(|e| SmokeError::Executor(e.to_string()))?;
        let message_id = uuid::Uuid::now_v7().to_string();
        let event = json!({"Records": [{
            "messageId": message_id,
            "receiptHandle": "relay-deploy-check",
            "body": body,
            "attributes": {"ApproximateReceiveCount": "1"},
            "messageAttributes": {},
            "eventSource": "aws:sqs",
            "eventSourceARN": "relay-deploy-check",
        }]});
        let answer = self.hook.invoke(&self.hook.executor, &event).await.map_err(SmokeError::Executor)?;
        match answer["batchItemFailures"].as_array() {
            Some(failed) if failed.is_empty() => Ok(()),
            Some(_) => Err(SmokeError::Executor(format!(
                "{} returned the job's message unrecorded (it could not reach the database, or the job did not end in time): {answer}",
                self.hook.executor
            ))),
            None => {
                Err(SmokeError::Executor(format!("{} answered {answer}, not a batch response", self.hook.executor)))
            }
        }
    }
}
