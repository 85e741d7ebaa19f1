//! Per-task credentials: every task type runs under its own IAM role, assumed through STS for
//! each run; the executor's own identity can do nothing but assume those roles.
//!
//! - `TaskRoles`: the mapping task type → role (`RELAY_TASK_ROLES`), with per-tenant overrides
//!   for roles in a tenant's own account, always with an external id
//!   (`RELAY_TENANT_TASK_ROLES`), and the session length (`RELAY_TASK_SESSION_SECONDS`).
//! - Default deny: a task type with no mapping gets no credentials at all — never the parent
//!   role; its `ctx.aws()` fails with an error naming the missing mapping, and the job fails
//!   for good through the one terminal path (an exception opens).
//! - `session`: the session name (job id and attempt) and tags (tenant, task type), pure.
//! - `sts`: the assumer, recording every session on the attempt (`attempt_sessions`), and a
//!   credentials provider that re-assumes before expiry during long runs.
//!
//! This scopes blast radius; it is not a tenant boundary and is not called one.

pub mod session;
pub mod sts;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use crate::email::task::SendEmail;
use crate::job::TenantId;
use crate::task::Task;

pub use sts::{JobAws, TaskCredentials};

/// Chained role sessions (a Lambda role assuming a task role) last at most one hour.
pub const MAX_SESSION: Duration = Duration::from_secs(3600);
/// STS's shortest session.
pub const MIN_STS_SESSION_SECONDS: u64 = 900;

/// The role a task type runs under, and the external id when it lives in a tenant's account.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSpec {
    pub role_arn: String,
    #[serde(default)]
    pub external_id: Option<String>,
}

/// A mapping entry as written in `RELAY_TASK_ROLES`: an ARN, or `{"role_arn", "external_id"?}`.
#[derive(Deserialize)]
#[serde(untagged)]
enum Entry {
    Arn(String),
    Spec(RoleSpec),
}

impl From<Entry> for RoleSpec {
    fn from(e: Entry) -> Self {
        match e {
            Entry::Arn(role_arn) => RoleSpec { role_arn, external_id: None },
            Entry::Spec(s) => s,
        }
    }
}

/// Which role each task type (and each tenant's task type) runs under. Empty: every task's
/// AWS access is denied.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskRoles {
    tasks: BTreeMap<String, RoleSpec>,
    tenants: BTreeMap<TenantId, BTreeMap<String, RoleSpec>>,
    session: Duration,
}

impl Default for TaskRoles {
    fn default() -> Self {
        Self { tasks: BTreeMap::new(), tenants: BTreeMap::new(), session: MAX_SESSION }
    }
}

/// A mapping that cannot be used. Refused when the mapping is built, never at the first call.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MappingError {
    #[error("session duration {0} s is longer than 3600 s, the most a chained role session may last")]
    SessionTooLong(u64),
    #[error("session duration must be at least 1 s")]
    SessionTooShort,
    #[error("{0:?} is not an IAM role ARN (arn:aws:iam::<account>:role/<name>)")]
    RoleArn(String),
    #[error("external id for {0:?} must be 2 to 1224 characters of letters, digits and +=,.@:/-")]
    ExternalId(String),
    #[error("tenant {tenant}'s role for {task_type:?} needs an external id (it lives in the tenant's account)")]
    TenantWithoutExternalId { tenant: TenantId, task_type: String },
}

/// A task-role setting that cannot be used; the message names the variable.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{name} is invalid ({value:?}): {problem}")]
pub struct RolesConfigError {
    pub name: &'static str,
    /// The value as set (its first 200 characters).
    pub value: String,
    pub problem: RolesProblem,
}

/// What is wrong with a task-role setting.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RolesProblem {
    #[error("{0}")]
    NotANumber(std::num::ParseIntError),
    #[error("STS sessions last at least {MIN_STS_SESSION_SECONDS} s")]
    BelowStsMinimum,
    /// `RELAY_TASK_ROLES` is not the expected JSON (serde's message).
    #[error("expected {{\"<task type>\": \"<role arn>\" | {{\"role_arn\", \"external_id\"?}}}}: {0}")]
    TaskRolesShape(String),
    /// `RELAY_TENANT_TASK_ROLES` is not the expected JSON (serde's message).
    #[error("expected {{\"<tenant id>\": {{\"<task type>\": {{\"role_arn\", \"external_id\"}}}}}}: {0}")]
    TenantRolesShape(String),
    #[error("{task}: {error}")]
    Task { task: String, error: MappingError },
    #[error("{0}")]
    Mapping(MappingError),
}

impl TaskRoles {
    /// An empty mapping whose sessions last `secs` seconds (at most 3600: refused here, up
    /// front, rather than by STS at the first call).
    pub fn with_session_seconds(secs: u64) -> Result<Self, MappingError> {
        if secs > MAX_SESSION.as_secs() {
            return Err(MappingError::SessionTooLong(secs));
        }
        if secs == 0 {
            return Err(MappingError::SessionTooShort);
        }
        Ok(Self { session: Duration::from_secs(secs), ..Self::default() })
    }

    /// Map a task type to a role (for every tenant without an override).
    pub fn map_task(mut self, task_type: &str, role: RoleSpec) -> Result<Self, MappingError> {
        check_role(&role)?;
        self.tasks.insert(task_type.to_owned(), role);
        Ok(self)
    }

    /// Map one tenant's task type to a role in the tenant's account (external id required).
    pub fn map_tenant_task(mut self, tenant: TenantId, task_type: &str, role: RoleSpec) -> Result<Self, MappingError> {
        check_role(&role)?;
        if role.external_id.is_none() {
            return Err(MappingError::TenantWithoutExternalId { tenant, task_type: task_type.to_owned() });
        }
        self.tenants.entry(tenant).or_default().insert(task_type.to_owned(), role);
        Ok(self)
    }

    /// The role for this tenant's task type: the tenant's override, else the task's mapping,
    /// else none (default deny).
    pub fn resolve(&self, tenant: TenantId, task_type: &str) -> Option<&RoleSpec> {
        self.tenants.get(&tenant).and_then(|m| m.get(task_type)).or_else(|| self.tasks.get(task_type))
    }

    /// The role a task type runs under for every tenant without an override, if mapped.
    pub fn task_role(&self, task_type: &str) -> Option<&RoleSpec> {
        self.tasks.get(task_type)
    }

    pub fn session(&self) -> Duration {
        self.session
    }

    pub fn is_empty(&self) -> bool {
        self.tasks.is_empty() && self.tenants.is_empty()
    }

    /// Read `RELAY_TASK_ROLES`, `RELAY_TENANT_TASK_ROLES` and `RELAY_TASK_SESSION_SECONDS`
    /// (default 3600, 900 to 3600). Every error names the variable.
    pub fn from_lookup(get: impl Fn(&str) -> Option<String>) -> Result<Self, RolesConfigError> {
        let text = |name: &'static str| get(name).map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let invalid = |name: &'static str, value: &str, problem: RolesProblem| RolesConfigError {
            name,
            value: value.chars().take(200).collect(),
            problem,
        };
        const SECS: &str = "RELAY_TASK_SESSION_SECONDS";
        let secs = match text(SECS) {
            None => MAX_SESSION.as_secs(),
            Some(v) => {
                let n: u64 = v.parse().map_err(|e| invalid(SECS, &v, RolesProblem::NotANumber(e)))?;
                if n < MIN_STS_SESSION_SECONDS {
                    return Err(invalid(SECS, &v, RolesProblem::BelowStsMinimum));
                }
                n
            }
        };
        let mut roles =
            Self::with_session_seconds(secs).map_err(|e| invalid(SECS, &secs.to_string(), RolesProblem::Mapping(e)))?;
        const TASKS: &str = "RELAY_TASK_ROLES";
        if let Some(v) = text(TASKS) {
            let map: BTreeMap<String, Entry> = serde_json::from_str(&v)
                .map_err(|e| invalid(TASKS, &v, RolesProblem::TaskRolesShape(e.to_string())))?;
            for (task, entry) in map {
                roles = roles
                    .map_task(&task, entry.into())
                    .map_err(|error| invalid(TASKS, &v, RolesProblem::Task { task, error }))?;
            }
        }
        const TENANTS: &str = "RELAY_TENANT_TASK_ROLES";
        if let Some(v) = text(TENANTS) {
            let map: BTreeMap<TenantId, BTreeMap<String, RoleSpec>> = serde_json::from_str(&v)
                .map_err(|e| invalid(TENANTS, &v, RolesProblem::TenantRolesShape(e.to_string())))?;
            for (tenant, tasks) in map {
                for (task, role) in tasks {
                    roles = roles
                        .map_tenant_task(tenant, &task, role)
                        .map_err(|e| invalid(TENANTS, &v, RolesProblem::Mapping(e)))?;
                }
            }
        }
        Ok(roles)
    }
}

/// The task types that run under a tenant's own sending role when it names one.
pub const SENDS_AS_TENANT: [&str; 1] = [SendEmail::NAME];

/// The external id Relay presents when it assumes a tenant's own role: chosen by Relay, one per
/// tenant, so no other tenant can make Relay assume it (the confused-deputy guard).
pub fn tenant_external_id(tenant: TenantId) -> String {
    format!("relay-{tenant}")
}

/// Whether a role ARN is well formed (`arn:aws:iam::<12 digits>:role/<name>`).
pub fn valid_role_arn(arn: &str) -> bool {
    check_role(&RoleSpec { role_arn: arn.to_owned(), external_id: None }).is_ok()
}

fn check_role(role: &RoleSpec) -> Result<(), MappingError> {
    let arn = &role.role_arn;
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    let ok = parts.len() == 6
        && parts[0] == "arn"
        && parts[1].starts_with("aws")
        && parts[2] == "iam"
        && parts[3].is_empty()
        && parts[4].len() == 12
        && parts[4].chars().all(|c| c.is_ascii_digit())
        && parts[5].strip_prefix("role/").is_some_and(|n| !n.is_empty() && !n.ends_with('/'));
    if !ok {
        return Err(MappingError::RoleArn(arn.clone()));
    }
    if let Some(x) = &role.external_id {
        let valid =
            (2..=1224).contains(&x.len()) && x.chars().all(|c| c.is_ascii_alphanumeric() || "_+=,.@:/-".contains(c));
        if !valid {
            return Err(MappingError::ExternalId(role.role_arn.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn read(vars: &[(&str, &str)]) -> Result<TaskRoles, RolesConfigError> {
        let map: HashMap<String, String> = vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        TaskRoles::from_lookup(|k| map.get(k).cloned())
    }

    const EMAIL: &str = "arn:aws:iam::123456789012:role/relay-task-email-send";
    const TENANT_ROLE: &str = "arn:aws:iam::210987654321:role/relay-sender";

    #[test]
    fn task_types_map_to_roles_and_tenants_override_with_an_external_id() {
        let tenant = TenantId::new();
        let r = read(&[
            ("RELAY_TASK_ROLES", &format!(r#"{{"email.send": "{EMAIL}"}}"#)),
            (
                "RELAY_TENANT_TASK_ROLES",
                &format!(
                    r#"{{"{tenant}": {{"email.send": {{"role_arn": "{TENANT_ROLE}", "external_id": "relay-acme"}}}}}}"#
                ),
            ),
        ])
        .unwrap();
        assert_eq!(r.session(), MAX_SESSION);
        assert_eq!(r.resolve(TenantId::new(), "email.send").unwrap().role_arn, EMAIL);
        let own = r.resolve(tenant, "email.send").unwrap();
        assert_eq!((own.role_arn.as_str(), own.external_id.as_deref()), (TENANT_ROLE, Some("relay-acme")));
        assert_eq!(r.resolve(tenant, "noop"), None, "default deny");
        assert!(read(&[]).unwrap().is_empty());
    }

    #[test]
    fn sessions_beyond_an_hour_are_refused_up_front_naming_the_variable() {
        let e = read(&[("RELAY_TASK_SESSION_SECONDS", "7200")]).unwrap_err().to_string();
        assert!(e.starts_with("RELAY_TASK_SESSION_SECONDS is invalid") && e.contains("3600"), "{e}");
        let e = read(&[("RELAY_TASK_SESSION_SECONDS", "60")]).unwrap_err().to_string();
        assert!(e.contains("at least 900"), "{e}");
        assert_eq!(read(&[("RELAY_TASK_SESSION_SECONDS", "900")]).unwrap().session(), Duration::from_secs(900));
        assert_eq!(TaskRoles::with_session_seconds(3601), Err(MappingError::SessionTooLong(3601)));
    }

    #[test]
    fn bad_mappings_name_their_variable() {
        let e = read(&[("RELAY_TASK_ROLES", "[1]")]).unwrap_err().to_string();
        assert!(e.starts_with("RELAY_TASK_ROLES is invalid"), "{e}");
        let e = read(&[("RELAY_TASK_ROLES", r#"{"email.send": "relay-task-email"}"#)]).unwrap_err().to_string();
        assert!(e.starts_with("RELAY_TASK_ROLES is invalid") && e.contains("not an IAM role ARN"), "{e}");
        let t = TenantId::new();
        let no_external = format!(r#"{{"{t}": {{"email.send": {{"role_arn": "{TENANT_ROLE}"}}}}}}"#);
        let e = read(&[("RELAY_TENANT_TASK_ROLES", &no_external)]).unwrap_err().to_string();
        assert!(e.starts_with("RELAY_TENANT_TASK_ROLES is invalid") && e.contains("external id"), "{e}");
        let e = read(&[("RELAY_TENANT_TASK_ROLES", r#"{"acme": {}}"#)]).unwrap_err().to_string();
        assert!(e.starts_with("RELAY_TENANT_TASK_ROLES is invalid"), "{e}");
    }
}
