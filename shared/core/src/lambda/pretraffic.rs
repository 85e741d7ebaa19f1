//! The pre-traffic hook: before CodeDeploy shifts any traffic to a deployment's new versions,
//! migrate the database, then check each new version by invoking it directly, so the work
//! reaches only that version:
//! - the smoke check (`crate::smoke`) through the **new** intake version (API Gateway's event
//!   shape), its job submitted to run a day later: no live (old) executor and no sweep will
//!   take it. The hook hands it to the **new** executor version
//!   (`{"relay_deploy_check": {"job_id"}}`), the only code that claims a check job before it is
//!   due (`Executor::run_check`), and requires that version to have claimed and finished it;
//! - the same with a second job for the **new long-lane executor** version;
//! - one sweep pass on the **new sweeper** version;
//! - an SES event parsed by the **new ingress** version, which reaches its tenant and stores
//!   nothing (`Ingress::deploy_check`).
//!
//! The verdict goes to CodeDeploy
//! (`PutLifecycleEventHookExecutionStatus`): `Failed` stops the deployment and CloudFormation
//! rolls the stack back. Invoked by hand (any payload without a `DeploymentId`, e.g. after a
//! stack's first deploy, when CodeDeploy runs no hook), a failed check fails the invocation.
//!
//! Every Lambda and CodeDeploy call Relay makes lives in this file.

use std::time::Duration;

use aws_sdk_codedeploy::types::LifecycleEventStatus;
use aws_sdk_lambda::error::{DisplayErrorContext, SdkError};
use aws_sdk_lambda::operation::invoke::InvokeError;
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

/// The tenant the hook's jobs belong to (created on first use; its key is replaced each run).
pub const TENANT: &str = super::executor::DEPLOY_CHECK_TENANT;

/// Why invoking a function gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum InvokeFailed {
    #[error("invoking {function}: {}", DisplayErrorContext(.error))]
    Call { function: String, error: Box<SdkError<InvokeError>> },
    #[error("{function} failed ({kind}): {payload}")]
    Function { function: String, kind: String, payload: String },
    #[error("{function} answered what is not JSON ({error}): {payload}")]
    NotJson { function: String, error: serde_json::Error, payload: String },
}

/// Why a check failed.
#[derive(Debug, thiserror::Error)]
pub enum CheckFailed {
    #[error("migrations: {0}")]
    Migrate(anyhow::Error),
    #[error("the deploy-check tenant: {0}")]
    Tenant(StoreError),
    #[error(transparent)]
    Smoke(#[from] SmokeError),
    #[error("{function}: {reason}")]
    Version { function: String, reason: String },
}

/// What the hook did and found; also its answer.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    pub passed: bool,
    pub migrations_applied: Vec<String>,
    pub job_id: Option<JobId>,
    pub seconds: f64,
    pub reason: Option<String>,
    /// Each new version checked and what it answered, in order.
    pub checked: Vec<Value>,
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
    /// The long-lane executor, sweeper and ingress versions, when given.
    executor_long: Option<String>,
    sweeper: Option<String>,
    ingress: Option<String>,
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
            executor_long: cfg.pretraffic_others[0].clone(),
            sweeper: cfg.pretraffic_others[1].clone(),
            ingress: cfg.pretraffic_others[2].clone(),
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
            checked: Vec::new(),
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
            checked = %serde_json::Value::Array(verdict.checked.clone()),
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
        let executors = std::iter::once(&self.executor).chain(&self.executor_long);
        for (n, executor) in executors.enumerate() {
            let versions = NewVersions { hook: self, key: key.clone(), executor };
            let done = smoke::run(&versions, self.within, Duration::from_millis(250)).await;
            let id = match &done {
                Ok(d) => Some(d.id),
                Err(SmokeError::Ended { id, .. } | SmokeError::TimedOut { id, .. } | SmokeError::Vanished(id)) => {
                    Some(*id)
                }
                Err(_) => None,
            };
            if n == 0 {
                verdict.job_id = id;
            }
            done?;
            verdict.checked.push(json!({"function": executor, "job_id": id, "succeeded": true}));
        }
        let check = json!({super::executor::DEPLOY_CHECK: {}});
        if let Some(sweeper) = &self.sweeper {
            let failed = |reason: String| CheckFailed::Version { function: sweeper.clone(), reason };
            let passes = self.invoke(sweeper, &check).await.map_err(|e| failed(e.to_string()))?;
            if !passes.is_array() {
                return Err(failed(format!("answered {passes}, not its sweep passes")));
            }
            verdict.checked.push(json!({"function": sweeper, "passes": passes}));
        }
        if let Some(ingress) = &self.ingress {
            let failed = |reason: String| CheckFailed::Version { function: ingress.clone(), reason };
            let answer = self.invoke(ingress, &check).await.map_err(|e| failed(e.to_string()))?;
            let done = &answer["deploy_check"];
            if done.get("task_type").is_none() {
                return Err(failed(format!("did not turn an SES event into a job: {answer}")));
            }
            verdict.checked.push(json!({"function": ingress, "answer": done}));
        }
        Ok(())
    }

    /// Invoke a function (synchronously) with a JSON event: its answer, or why there is none.
    async fn invoke(&self, function: &str, event: &Value) -> Result<Value, InvokeFailed> {
        let out = self
            .lambda
            .invoke()
            .function_name(function)
            .payload(Blob::new(event.to_string()))
            .send()
            .await
            .map_err(|e| InvokeFailed::Call { function: function.to_owned(), error: Box::new(e) })?;
        let payload = out.payload().map(|b| String::from_utf8_lossy(b.as_ref()).into_owned()).unwrap_or_default();
        if let Some(kind) = out.function_error() {
            return Err(InvokeFailed::Function { function: function.to_owned(), kind: kind.to_owned(), payload });
        }
        serde_json::from_str(&payload).map_err(|error| InvokeFailed::NotJson {
            function: function.to_owned(),
            error,
            payload,
        })
    }
}

/// The API as the new intake version serves it, and one new executor version behind it.
struct NewVersions<'a> {
    hook: &'a PreTraffic,
    key: String,
    executor: &'a str,
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
        let answer = self.hook.invoke(&self.hook.intake, &event).await.map_err(|e| ClientError::Http(e.to_string()))?;
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

    /// The job waits a day: only the executor version handed it below runs it.
    fn hold(&self) -> bool {
        true
    }

    /// Hand the job to this new executor version alone: it must claim it (no other code can,
    /// before it is due) and finish it within its invocation.
    async fn submitted(&self, job: &Value) -> Result<(), SmokeError> {
        let id = job["id"].as_str().and_then(|i| i.parse::<JobId>().ok());
        let Some(job_id) = id else { return Err(SmokeError::NoId(job.clone())) };
        let event = json!({super::executor::DEPLOY_CHECK: {"job_id": job_id}});
        let answer = self.hook.invoke(self.executor, &event).await.map_err(|e| SmokeError::Executor(e.to_string()))?;
        let done = &answer["deploy_check"];
        let executor = self.executor;
        if let Some(e) = done["error"].as_str() {
            return Err(SmokeError::Executor(format!("{executor}: {e}")));
        }
        match (done["claimed"].as_u64(), done["succeeded"].as_u64()) {
            (Some(1), Some(1)) => Ok(()),
            (Some(0), _) => Err(SmokeError::Executor(format!(
                "{executor} did not claim the check job (it does not fit the invocation's time left, or it is no longer pending): {answer}"
            ))),
            (Some(_), _) => Err(SmokeError::Executor(format!(
                "{executor} claimed the check job but did not finish it successfully: {answer}"
            ))),
            _ => Err(SmokeError::Executor(format!("{executor} answered {answer}, not a deploy check"))),
        }
    }
}
