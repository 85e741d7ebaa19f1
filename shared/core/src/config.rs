//! The Lambda functions' settings: read once per container, typed, and every error names the
//! variable at fault. The `relay` binary has its own flags (clap); a setting both read is a
//! `NumberSetting` defined here (its variable, default and bounds), which the tool's flags parse
//! with (`NumberSetting::parser`), so both refuse the same values the same way.

use std::time::Duration;

use crate::credentials::TaskRoles;

/// A setting that is missing or does not parse. The message names the variable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("{0} is not set")]
    Missing(&'static str),
    #[error("{name} is invalid ({value:?}): {why}")]
    Invalid { name: &'static str, value: String, why: String },
    #[error(transparent)]
    TaskRoles(#[from] crate::credentials::RolesConfigError),
    #[error(transparent)]
    Alerts(#[from] crate::alerts::AlertConfigError),
}

/// A whole-number setting: its variable, its default and the values it takes. Read by the
/// Lambda functions (`LambdaConfig`) and, as a flag's `env` and `value_parser`, by `relay`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NumberSetting {
    pub name: &'static str,
    pub default: u64,
    pub min: u64,
    pub max: u64,
}

/// `RELAY_LEASE_SECONDS`: the lease of a claim (the Lambda default; `relay`'s worker loops
/// heartbeat, and default to `LOCAL_LEASE_SECONDS`).
pub const LEASE_SECONDS: NumberSetting =
    NumberSetting { name: "RELAY_LEASE_SECONDS", default: 960, min: 3, max: 43_200 };
/// `relay`'s default lease: its worker loops heartbeat, so a short lease returns a dead
/// process's jobs soon.
pub const LOCAL_LEASE_SECONDS: u64 = 30;
/// `RELAY_RETENTION_DAYS`: the built-in retention schedule's days, when a migration creates it.
pub const RETENTION_DAYS: NumberSetting =
    NumberSetting { name: "RELAY_RETENTION_DAYS", default: 30, min: 1, max: 3650 };

/// A tenant limit's setting (`RELAY_LIMIT_…`): its default, 0 to `limits::MAX_LIMIT`.
pub fn limit_setting(kind: crate::limits::Kind) -> NumberSetting {
    NumberSetting {
        name: crate::limits::variable(kind),
        default: crate::limits::Defaults::default().of(kind).unsigned_abs(),
        min: 0,
        max: crate::limits::MAX_LIMIT.unsigned_abs(),
    }
}

impl NumberSetting {
    /// A value as given (trimmed): a whole number within the bounds, or an error naming the
    /// variable.
    pub fn parse(self, text: &str) -> Result<u64, ConfigError> {
        let text = text.trim();
        let invalid = |why: String| ConfigError::Invalid { name: self.name, value: text.to_owned(), why };
        match text.parse::<u64>() {
            Ok(n) if (self.min..=self.max).contains(&n) => Ok(n),
            Ok(_) => Err(invalid(format!("must be between {} and {}", self.min, self.max))),
            Err(e) => Err(invalid(e.to_string())),
        }
    }

    /// `parse` as a clap `value_parser`.
    pub fn parser(self) -> impl Fn(&str) -> Result<u64, ConfigError> + Clone + Send + Sync + 'static {
        move |text| self.parse(text)
    }

    /// Read through `text` (the variable's value, if set and not blank): the default when unset.
    fn read(self, text: impl Fn(&'static str) -> Option<String>) -> Result<u64, ConfigError> {
        text(self.name).map_or(Ok(self.default), |v| self.parse(&v))
    }
}

/// Settings shared by the five functions. Which ones a function needs is its own business:
/// `require_*` accessors fail with the variable's name when a needed one is absent.
#[derive(Debug, Clone, PartialEq)]
pub struct LambdaConfig {
    /// `DATABASE_URL`: Postgres (in production, the RDS Proxy endpoint), with libpq's
    /// `sslmode` and `sslrootcert`. On AWS (`AWS_LAMBDA_FUNCTION_NAME` set, no
    /// `AWS_ENDPOINT_URL`) a URL without `sslmode` gets `sslmode=verify-full`.
    pub database_url: Option<String>,
    /// `RELAY_DATABASE_SECRET`: the Secrets Manager secret (ARN or name) holding the
    /// database login, read at run time and again after a refused login (rotation). Unset:
    /// the URL's own login.
    pub database_secret: Option<String>,
    /// `RELAY_WORK_QUEUE_URL`: the SQS queue the executor consumes.
    pub work_queue_url: Option<String>,
    /// `AWS_ENDPOINT_URL`: a local AWS-protocol server (moto); unset on AWS.
    pub aws_endpoint_url: Option<String>,
    /// `RELAY_LEASE_SECONDS` (default 960): the lease of a claim. Must exceed the executor's
    /// function timeout, since a Lambda invocation does not heartbeat.
    pub lease: Duration,
    /// `RELAY_INGRESS_TENANT` (default `platform`): the tenant that owns ingress jobs.
    pub ingress_tenant: String,
    /// `RELAY_SWEEP_PASSES` (default 2) and `RELAY_SWEEP_GAP_SECONDS` (default 30): sweep
    /// passes per invocation of the sweeper and the pause between them.
    pub sweep_passes: u32,
    pub sweep_gap: Duration,
    /// `RELAY_DB_WAIT_SECONDS` (default 5): how long a call waits for the one connection.
    pub db_wait: Duration,
    /// `RELAY_TASK_ROLES`, `RELAY_TENANT_TASK_ROLES`, `RELAY_TASK_SESSION_SECONDS`: the role
    /// each task type runs under (the executor's); empty denies every task's AWS access.
    pub task_roles: TaskRoles,
    /// Alert emails for new exceptions (`RELAY_ALERT_TO`, `RELAY_ALERT_FROM`); the sweeper sends them.
    pub alerts: Option<crate::alerts::AlertConfig>,
    /// `RELAY_EXECUTOR_TIMEOUT_SECONDS` (default 900): the executor function's timeout. With
    /// `deadline_reserve` it bounds `timeout_seconds` at intake (`max_job_timeout`).
    pub executor_timeout: Duration,
    /// `RELAY_DEADLINE_RESERVE_SECONDS` (default 5): what the executor keeps back of each
    /// invocation to record outcomes; a job starts only if its timeout fits in the rest.
    pub deadline_reserve: Duration,
    /// `RELAY_CALLBACK_ALLOW`: CIDRs and host names callbacks may reach although the address
    /// guard refuses them (empty: none).
    pub callback_allow: crate::outbound::AllowList,
    /// `RELAY_WORK_DLQ_URL`, `RELAY_INGRESS_QUEUE_URL`, `RELAY_INGRESS_DLQ_URL`: the queues the
    /// admin function's redrive moves between.
    pub work_dlq_url: Option<String>,
    pub ingress_queue_url: Option<String>,
    pub ingress_dlq_url: Option<String>,
    /// `RELAY_PRETRAFFIC_INTAKE`, `RELAY_PRETRAFFIC_EXECUTOR`: the new versions the pre-traffic
    /// hook checks (a function name or a version's ARN).
    pub pretraffic_intake: Option<String>,
    pub pretraffic_executor: Option<String>,
    /// `RELAY_PRETRAFFIC_EXECUTOR_LONG`, `RELAY_PRETRAFFIC_SWEEPER`, `RELAY_PRETRAFFIC_INGRESS`:
    /// the other new versions the hook checks, each by invoking it directly (unset: not checked).
    pub pretraffic_others: [Option<String>; 3],
    /// `RELAY_PRETRAFFIC_WITHIN_SECONDS` (default 60): how long the hook's job has to succeed.
    pub pretraffic_within: Duration,
    /// `RELAY_RETENTION_DAYS` (default 30): the built-in retention schedule's days, when a
    /// migration (hook or admin) creates it.
    pub retention_days: u32,
    /// `AWS_ENDPOINT_URL_LAMBDA`, `AWS_ENDPOINT_URL_CODEDEPLOY`: local stand-ins; unset on AWS.
    pub lambda_endpoint_url: Option<String>,
    pub codedeploy_endpoint_url: Option<String>,
    /// The short lane's executor only: `RELAY_LANE_TIMEOUT_SECONDS`, its own function timeout,
    /// and `RELAY_LONG_QUEUE_URL`, the long-job lane's queue. A job whose timeout exceeds this
    /// lane's (less the reserve) goes there. `executor_timeout` stays the longest lane's.
    pub lane_timeout: Option<Duration>,
    pub long_queue_url: Option<String>,
    /// `RELAY_SES_CONFIGURATION_SET`: the configuration set every send names unless its
    /// request names one (the template's, whose events reach ingress).
    pub ses_configuration_set: Option<String>,
    /// `RELAY_SECRET_ROOT`: where destination secrets live in Secrets Manager, before
    /// `/tenants/…` (the template's `relay/<stack>`, so two stacks in one account keep apart);
    /// default `relay` (`destinations::DEFAULT_SECRET_ROOT`).
    pub secret_root: Option<String>,
    /// `RELAY_LIMIT_DESTINATIONS` (default 100), `RELAY_LIMIT_TEMPLATES` (1,000),
    /// `RELAY_LIMIT_SUPPRESSIONS` (1,000,000), `RELAY_LIMIT_TOPIC_OPT_OUTS` (1,000,000),
    /// `RELAY_LIMIT_PENDING_JOBS` (1,000,000): each
    /// tenant's limits unless an operator overrides one (`limits`); 0 to 1,000,000,000.
    pub limits: crate::limits::Defaults,
}

impl LambdaConfig {
    /// Read from the process environment.
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::from_lookup(|name| std::env::var(name).ok())
    }

    /// Read through any lookup (tests pass a map; nothing mutates the process environment).
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, ConfigError> {
        let text = |name: &'static str| get(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let number = |name: &'static str, default: u64, range: std::ops::RangeInclusive<u64>| match text(name) {
            None => Ok(default),
            Some(v) => match v.parse::<u64>() {
                Ok(n) if range.contains(&n) => Ok(n),
                Ok(_) => Err(ConfigError::Invalid {
                    name,
                    value: v,
                    why: format!("must be between {} and {}", range.start(), range.end()),
                }),
                Err(e) => Err(ConfigError::Invalid { name, value: v, why: e.to_string() }),
            },
        };
        let on_aws = text("AWS_LAMBDA_FUNCTION_NAME").is_some() && text("AWS_ENDPOINT_URL").is_none();
        let database_url = match text("DATABASE_URL") {
            Some(url) => Some(match crate::store::tls::DbUrl::parse(&url) {
                // The URL may hold a password: never echo it.
                Err(e) => {
                    return Err(ConfigError::Invalid {
                        name: "DATABASE_URL",
                        value: "<hidden>".into(),
                        why: e.to_string(),
                    });
                }
                Ok(_) if on_aws && !has_sslmode(&url) => with_verify_full(&url),
                Ok(_) => url,
            }),
            None => None,
        };
        let url_like = |name: &'static str| match text(name) {
            Some(v) if !(v.starts_with("https://") || v.starts_with("http://")) => {
                Err(ConfigError::Invalid { name, value: v, why: "must be an http(s) URL".into() })
            }
            v => Ok(v),
        };
        Ok(Self {
            database_url,
            database_secret: text("RELAY_DATABASE_SECRET"),
            work_queue_url: url_like("RELAY_WORK_QUEUE_URL")?,
            aws_endpoint_url: url_like("AWS_ENDPOINT_URL")?,
            lease: Duration::from_secs(LEASE_SECONDS.read(text)?),
            ingress_tenant: text("RELAY_INGRESS_TENANT").unwrap_or_else(|| "platform".into()),
            sweep_passes: u32::try_from(number("RELAY_SWEEP_PASSES", 2, 1..=10)?).unwrap_or(2),
            sweep_gap: Duration::from_secs(number("RELAY_SWEEP_GAP_SECONDS", 30, 0..=300)?),
            db_wait: Duration::from_secs(number("RELAY_DB_WAIT_SECONDS", 5, 1..=60)?),
            executor_timeout: Duration::from_secs(number("RELAY_EXECUTOR_TIMEOUT_SECONDS", 900, 10..=900)?),
            deadline_reserve: Duration::from_secs(number("RELAY_DEADLINE_RESERVE_SECONDS", 5, 1..=60)?),
            task_roles: TaskRoles::from_lookup(&get)?,
            alerts: crate::alerts::AlertConfig::from_lookup(&get)?,
            callback_allow: match text("RELAY_CALLBACK_ALLOW") {
                None => Default::default(),
                Some(v) => crate::outbound::AllowList::parse(&v).map_err(|e| ConfigError::Invalid {
                    name: "RELAY_CALLBACK_ALLOW",
                    value: v,
                    why: e.to_string(),
                })?,
            },
            work_dlq_url: url_like("RELAY_WORK_DLQ_URL")?,
            ingress_queue_url: url_like("RELAY_INGRESS_QUEUE_URL")?,
            ingress_dlq_url: url_like("RELAY_INGRESS_DLQ_URL")?,
            pretraffic_intake: text("RELAY_PRETRAFFIC_INTAKE"),
            pretraffic_executor: text("RELAY_PRETRAFFIC_EXECUTOR"),
            pretraffic_others: [
                text("RELAY_PRETRAFFIC_EXECUTOR_LONG"),
                text("RELAY_PRETRAFFIC_SWEEPER"),
                text("RELAY_PRETRAFFIC_INGRESS"),
            ],
            pretraffic_within: Duration::from_secs(number("RELAY_PRETRAFFIC_WITHIN_SECONDS", 60, 5..=600)?),
            retention_days: u32::try_from(RETENTION_DAYS.read(text)?).unwrap_or(30),
            lambda_endpoint_url: url_like("AWS_ENDPOINT_URL_LAMBDA")?,
            codedeploy_endpoint_url: url_like("AWS_ENDPOINT_URL_CODEDEPLOY")?,
            lane_timeout: match text("RELAY_LANE_TIMEOUT_SECONDS") {
                None => None,
                Some(_) => Some(Duration::from_secs(number("RELAY_LANE_TIMEOUT_SECONDS", 900, 10..=900)?)),
            },
            long_queue_url: url_like("RELAY_LONG_QUEUE_URL")?,
            ses_configuration_set: match text("RELAY_SES_CONFIGURATION_SET") {
                Some(v) if v.len() > 64 || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') => {
                    return Err(ConfigError::Invalid {
                        name: "RELAY_SES_CONFIGURATION_SET",
                        value: v,
                        why: "1 to 64 letters, digits, '_' or '-'".into(),
                    });
                }
                v => v,
            },
            secret_root: match text("RELAY_SECRET_ROOT") {
                Some(v) if crate::destinations::check_secret_root(&v).is_err() => {
                    return Err(ConfigError::Invalid {
                        name: "RELAY_SECRET_ROOT",
                        value: v,
                        why: crate::destinations::SECRET_ROOT_RULE.into(),
                    });
                }
                v => v,
            },
            limits: {
                let mut d = crate::limits::Defaults::default();
                for kind in crate::limits::Kind::ALL {
                    let n = limit_setting(kind).read(text)?;
                    d.set(kind, i64::try_from(n).unwrap_or(crate::limits::MAX_LIMIT));
                }
                d
            },
        })
    }

    pub fn require_database_url(&self) -> Result<&str, ConfigError> {
        self.database_url.as_deref().ok_or(ConfigError::Missing("DATABASE_URL"))
    }

    /// The longest `timeout_seconds` the executor function can ever give one attempt: its
    /// timeout less the reserve kept to record outcomes (895 s by default). Intake refuses more.
    pub fn max_job_timeout(&self) -> i32 {
        let secs = self.executor_timeout.saturating_sub(self.deadline_reserve).as_secs().max(1);
        i32::try_from(secs).unwrap_or(i32::MAX)
    }

    /// The short lane's limit and the long lane's queue, when this executor has a longer lane.
    pub fn onward(&self) -> Option<(i32, &str)> {
        let lane = self.lane_timeout?.saturating_sub(self.deadline_reserve).as_secs().max(1);
        Some((i32::try_from(lane).unwrap_or(i32::MAX), self.long_queue_url.as_deref()?))
    }

    pub fn require_work_queue_url(&self) -> Result<&str, ConfigError> {
        self.work_queue_url.as_deref().ok_or(ConfigError::Missing("RELAY_WORK_QUEUE_URL"))
    }
}

fn has_sslmode(url: &str) -> bool {
    url.split(['?', '&', ' ']).any(|p| p.trim_start().starts_with("sslmode="))
}

/// The URL with `sslmode=verify-full` added (URL or `key=value` form).
fn with_verify_full(url: &str) -> String {
    if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        format!("{url}{}sslmode=verify-full", if url.contains('?') { '&' } else { '?' })
    } else {
        format!("{url} sslmode=verify-full")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<LambdaConfig, ConfigError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        LambdaConfig::from_lookup(|k| map.get(k).cloned())
    }

    #[test]
    fn defaults_apply_and_required_settings_name_their_variable() {
        let c = read(&[]).unwrap();
        assert_eq!(c.lease, Duration::from_secs(960));
        assert_eq!(c.max_job_timeout(), 895, "900 s of invocation less the 5 s reserve");
        assert_eq!(c.ingress_tenant, "platform");
        assert_eq!((c.sweep_passes, c.sweep_gap), (2, Duration::from_secs(30)));
        assert_eq!(c.require_database_url().unwrap_err().to_string(), "DATABASE_URL is not set");
        assert_eq!(c.require_work_queue_url().unwrap_err().to_string(), "RELAY_WORK_QUEUE_URL is not set");
        assert_eq!(c.limits, crate::limits::Defaults::default());
    }

    #[test]
    fn tenant_limits_read_from_the_environment_and_bad_values_name_their_variable() {
        let d = read(&[("RELAY_LIMIT_DESTINATIONS", "5"), ("RELAY_LIMIT_PENDING_JOBS", " 0 ")]).unwrap().limits;
        assert_eq!((d.destinations, d.pending_jobs, d.templates, d.suppressions), (5, 0, 1_000, 1_000_000));
        for bad in ["-1", "1000000001", "many", "1e3"] {
            let e = read(&[("RELAY_LIMIT_TEMPLATES", bad)]).unwrap_err().to_string();
            assert!(e.starts_with("RELAY_LIMIT_TEMPLATES is invalid"), "{e}");
        }
    }

    #[test]
    fn a_shared_setting_refuses_out_of_bounds_values_as_its_parser_does() {
        for (bad, why) in [("2", "must be between 3 and 43200"), ("43201", "must be between 3 and 43200")] {
            let e = read(&[("RELAY_LEASE_SECONDS", bad)]).unwrap_err();
            assert_eq!(e, LEASE_SECONDS.parse(bad).unwrap_err(), "the Lambda reader and the tool's parser agree");
            assert_eq!(e.to_string(), format!("RELAY_LEASE_SECONDS is invalid ({bad:?}): {why}"));
        }
        assert_eq!(read(&[("RELAY_LEASE_SECONDS", "3")]).unwrap().lease, Duration::from_secs(3));
        assert_eq!(LEASE_SECONDS.parse(" 43200 "), Ok(43_200));
        let e = read(&[("RELAY_RETENTION_DAYS", "0")]).unwrap_err();
        assert_eq!(e, RETENTION_DAYS.parse("0").unwrap_err());
        let limit = limit_setting(crate::limits::Kind::Templates);
        assert_eq!((limit.name, limit.default, limit.max), ("RELAY_LIMIT_TEMPLATES", 1_000, 1_000_000_000));
    }

    #[test]
    fn invalid_values_name_the_variable_and_hide_secrets() {
        let e = read(&[("RELAY_LEASE_SECONDS", "soon")]).unwrap_err().to_string();
        assert!(e.starts_with("RELAY_LEASE_SECONDS is invalid"), "{e}");
        let e = read(&[("RELAY_SWEEP_PASSES", "0")]).unwrap_err().to_string();
        assert!(e.contains("RELAY_SWEEP_PASSES") && e.contains("between 1 and 10"), "{e}");
        let e = read(&[("RELAY_WORK_QUEUE_URL", "relay-work")]).unwrap_err().to_string();
        assert!(e.starts_with("RELAY_WORK_QUEUE_URL is invalid"), "{e}");
        let e = read(&[("DATABASE_URL", "postgres://u:s3cret@h:notaport/db")]).unwrap_err().to_string();
        assert!(e.starts_with("DATABASE_URL is invalid") && !e.contains("s3cret"), "{e}");
        let ok =
            read(&[("DATABASE_URL", "postgres://u:p@proxy:5432/relay"), ("RELAY_WORK_QUEUE_URL", "https://sqs.x/1/q")]);
        assert_eq!(ok.unwrap().require_work_queue_url().unwrap(), "https://sqs.x/1/q");
    }

    #[test]
    fn the_alert_task_role_and_callback_settings_errors_read_as_every_other_setting_error() {
        let e = |vars: &[(&str, &str)]| read(vars).unwrap_err().to_string();
        assert_eq!(e(&[("RELAY_ALERT_TO", "ops")]), r#"RELAY_ALERT_TO is invalid ("ops"): not an email address"#);
        assert_eq!(
            e(&[("RELAY_TASK_SESSION_SECONDS", "60")]),
            r#"RELAY_TASK_SESSION_SECONDS is invalid ("60"): STS sessions last at least 900 s"#
        );
        assert_eq!(
            e(&[("RELAY_TASK_ROLES", r#"{"email.send": "x"}"#)]),
            r#"RELAY_TASK_ROLES is invalid ("{\"email.send\": \"x\"}"): email.send: "x" is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)"#
        );
        assert_eq!(
            e(&[("RELAY_CALLBACK_ALLOW", "10.0.0.0/33")]),
            r#"RELAY_CALLBACK_ALLOW is invalid ("10.0.0.0/33"): "10.0.0.0/33": prefix longer than 32"#
        );
    }

    #[test]
    fn on_aws_the_database_url_defaults_to_verify_full() {
        let url = |vars: &[(&str, &str)]| read(vars).unwrap().database_url.unwrap();
        let lambda = ("AWS_LAMBDA_FUNCTION_NAME", "relay-executor");
        assert_eq!(
            url(&[lambda, ("DATABASE_URL", "postgres://relay@proxy/relay")]),
            "postgres://relay@proxy/relay?sslmode=verify-full"
        );
        assert_eq!(
            url(&[lambda, ("DATABASE_URL", "postgres://relay@proxy/relay?application_name=x")]),
            "postgres://relay@proxy/relay?application_name=x&sslmode=verify-full"
        );
        assert_eq!(
            url(&[lambda, ("DATABASE_URL", "host=proxy user=relay")]),
            "host=proxy user=relay sslmode=verify-full"
        );
        // Stated modes are kept; off AWS (or against moto) the URL is left as it is.
        let stated = "postgres://relay@proxy/relay?sslmode=require";
        assert_eq!(url(&[lambda, ("DATABASE_URL", stated)]), stated);
        assert_eq!(url(&[("DATABASE_URL", "postgres://relay@db/relay")]), "postgres://relay@db/relay");
        let local =
            [lambda, ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"), ("DATABASE_URL", "postgres://relay@db/relay")];
        assert_eq!(url(&local), "postgres://relay@db/relay");
        let e = read(&[("DATABASE_URL", "postgres://u:s3cret@h/db?sslmode=verify")]).unwrap_err().to_string();
        assert!(e.starts_with("DATABASE_URL is invalid") && e.contains("sslmode") && !e.contains("s3cret"), "{e}");
        assert_eq!(
            read(&[("RELAY_DATABASE_SECRET", "arn:aws:secretsmanager:x")]).unwrap().database_secret.as_deref(),
            Some("arn:aws:secretsmanager:x")
        );
    }
}
