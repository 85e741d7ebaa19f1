//! The terms a new job is made on, whoever makes it (the API, schedules, ingress, a campaign's
//! fan-out): its idempotency key, its correlation id, when it is due, how many attempts it has
//! and how long each may run, and how many jobs of its concurrency key run at once. What a
//! client gives is parsed here into values that hold their bounds; the defaults are stated once.
//! No I/O here.

use chrono::{DateTime, SecondsFormat, Utc};
use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::JobId;

/// Attempts a job has unless its submitter says otherwise.
pub const DEFAULT_MAX_ATTEMPTS: i32 = 5;
/// The most attempts a job may ask for.
pub const MAX_ATTEMPTS: i32 = 100;
/// Seconds an attempt may run unless its submitter says otherwise (or the deployment allows less).
pub const DEFAULT_TIMEOUT_SECONDS: i32 = 300;
/// The longest `timeout_seconds` a deployment may allow (one that runs jobs under a deadline,
/// the SQS transport on Lambda, allows less: `Settings::max_timeout_seconds`).
pub const MAX_TIMEOUT_SECONDS: i32 = 86_400;
/// How far ahead a job may be put.
pub const MAX_DELAY_SECONDS: u32 = 366 * 24 * 3600;
/// The longest idempotency key, correlation id and concurrency key.
pub const MAX_KEY_LEN: usize = 200;
/// The largest `concurrency_limit`.
pub const MAX_CONCURRENCY_LIMIT: i32 = 10_000;

/// A term that breaks its bounds. The message is what a client reads; `field` names the field.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Invalid {
    #[error("an idempotency key is 1 to {MAX_KEY_LEN} visible ASCII characters")]
    IdempotencyKey,
    #[error("correlation_id: 1 to {MAX_KEY_LEN} characters, no control characters")]
    CorrelationId,
    #[error("delay_seconds: give run_at or delay_seconds, not both")]
    RunAtAndDelay,
    #[error("delay_seconds: at most one year")]
    DelayTooLong,
    #[error("max_attempts: between 1 and {MAX_ATTEMPTS}")]
    MaxAttempts,
    /// `longest` is what this deployment allows.
    #[error("timeout_seconds: between 1 and {longest}{}", on_deployment(*longest))]
    Timeout { longest: i32 },
    #[error("concurrency_key: 1 to {MAX_KEY_LEN} characters, no control characters")]
    ConcurrencyKey,
    #[error("concurrency_limit: between 1 and {MAX_CONCURRENCY_LIMIT}")]
    ConcurrencyLimit,
    #[error("concurrency_limit: a concurrency_key needs a concurrency_limit")]
    KeyWithoutLimit,
    #[error("concurrency_key: a concurrency_limit needs a concurrency_key")]
    LimitWithoutKey,
    #[error("ordering_key: 1 to {MAX_KEY_LEN} characters, no control characters")]
    OrderingKey,
    #[error("ordering_on_failure: only with an ordering_key")]
    OnFailureWithoutKey,
}

fn on_deployment(longest: i32) -> &'static str {
    if longest < MAX_TIMEOUT_SECONDS {
        " on this deployment: each attempt runs within one invocation of the executor function"
    } else {
        ""
    }
}

impl Invalid {
    /// The field at fault.
    pub fn field(self) -> &'static str {
        match self {
            Invalid::IdempotencyKey => "idempotency_key",
            Invalid::CorrelationId => "correlation_id",
            Invalid::RunAtAndDelay | Invalid::DelayTooLong => "delay_seconds",
            Invalid::MaxAttempts => "max_attempts",
            Invalid::Timeout { .. } => "timeout_seconds",
            Invalid::ConcurrencyKey | Invalid::LimitWithoutKey => "concurrency_key",
            Invalid::ConcurrencyLimit | Invalid::KeyWithoutLimit => "concurrency_limit",
            Invalid::OrderingKey => "ordering_key",
            Invalid::OnFailureWithoutKey => "ordering_on_failure",
        }
    }
}

/// A key or id a client names: 1 to `MAX_KEY_LEN` characters, none of them a control character.
fn printable(s: &str) -> bool {
    (1..=MAX_KEY_LEN).contains(&s.chars().count()) && !s.chars().any(char::is_control)
}

/// A job's idempotency key: unique per tenant, so a job is made once however often it is asked
/// for. A client's is 1 to `MAX_KEY_LEN` visible ASCII characters; Relay derives the keys of the
/// jobs it makes itself from what made them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    pub fn parse(key: &str) -> Result<Self, Invalid> {
        if key.is_empty() || key.len() > MAX_KEY_LEN || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(Invalid::IdempotencyKey);
        }
        Ok(Self(key.to_owned()))
    }

    /// The job of one slot of one schedule: `schedule:<schedule id>:<slot, RFC 3339>`.
    pub fn schedule_slot(schedule_id: Uuid, slot: DateTime<Utc>) -> Self {
        Self(format!("schedule:{schedule_id}:{}", slot.to_rfc3339_opts(SecondsFormat::Secs, true)))
    }

    /// The schedule a job was fired by, read back from its key.
    pub fn schedule_of(key: &str) -> Option<Uuid> {
        let rest = key.strip_prefix("schedule:")?;
        Uuid::parse_str(rest.split(':').next()?).ok()
    }

    /// A campaign's child for the recipient at `position`: `campaign:<campaign id>:<position>`.
    pub fn campaign_child(campaign: JobId, position: usize) -> Self {
        Self(format!("campaign:{campaign}:{position}"))
    }

    /// The alert email of one exception: `alert:<exception id>`.
    pub fn exception_alert(exception: Uuid) -> Self {
        Self(format!("alert:{exception}"))
    }

    /// A provider's message (`sns` or `sqs` and its id, as received): `<envelope>:<id>`, or
    /// `None` when that is longer than `MAX_KEY_LEN`.
    pub fn provider_message(envelope: &str, message_id: &str) -> Option<Self> {
        let key = format!("{envelope}:{message_id}");
        (key.len() <= MAX_KEY_LEN).then_some(Self(key))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<IdempotencyKey> for String {
    fn from(key: IdempotencyKey) -> String {
        key.0
    }
}

/// A correlation id as a client gives it; carried by every retry, child and event of its job.
/// A job given none is correlated by its own id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorrelationId(String);

impl CorrelationId {
    pub fn parse(id: &str) -> Result<Self, Invalid> {
        if !printable(id) {
            return Err(Invalid::CorrelationId);
        }
        Ok(Self(id.to_owned()))
    }

    /// The job of one slot of the schedule named `name`: `schedule:<name>:<slot, RFC 3339>`.
    pub fn schedule_slot(name: &str, slot: DateTime<Utc>) -> Self {
        Self(format!("schedule:{name}:{}", slot.to_rfc3339_opts(SecondsFormat::Secs, true)))
    }

    /// The alert email of one exception: `relay-alert:<exception id>`.
    pub fn exception_alert(exception: Uuid) -> Self {
        Self(format!("relay-alert:{exception}"))
    }

    /// An idempotency key (1 to 200 visible ASCII characters) is always a correlation id.
    pub fn of_key(key: &IdempotencyKey) -> Self {
        Self(key.0.clone())
    }

    /// A job given no correlation id is correlated by its own id.
    pub fn of_job(id: JobId) -> Self {
        Self(id.to_string())
    }

    /// The correlation id of a job already made (read back from its row), carried by what it
    /// makes in turn (a campaign's children).
    pub(crate) fn carried(id: &str) -> Self {
        Self(id.to_owned())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<CorrelationId> for String {
    fn from(id: CorrelationId) -> String {
        id.0
    }
}

/// When a job asked to run at `run_at`, or `delay_seconds` from `now` (not both), is due: never
/// before `now`; a delay of at most `MAX_DELAY_SECONDS`.
pub fn due_at(
    run_at: Option<DateTime<Utc>>,
    delay_seconds: Option<u32>,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, Invalid> {
    match (run_at, delay_seconds) {
        (Some(_), Some(_)) => Err(Invalid::RunAtAndDelay),
        (_, Some(d)) if d > MAX_DELAY_SECONDS => Err(Invalid::DelayTooLong),
        (Some(at), None) => Ok(at.max(now)),
        (None, Some(d)) => Ok(now + chrono::Duration::seconds(d.into())),
        (None, None) => Ok(now),
    }
}

/// How many attempts a job has, and how long each may run: within bounds by construction, so
/// the `jobs` table keeps no check of its own for them (migration 0020).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    max_attempts: i32,
    timeout_seconds: i32,
}

impl Limits {
    /// What a job gets when nobody says otherwise.
    pub const DEFAULT: Limits = Limits::fixed(DEFAULT_MAX_ATTEMPTS, DEFAULT_TIMEOUT_SECONDS);

    /// Limits Relay sets itself. Used in a `const`, a value out of bounds fails the build.
    pub const fn fixed(max_attempts: i32, timeout_seconds: i32) -> Limits {
        assert!(1 <= max_attempts && max_attempts <= MAX_ATTEMPTS, "max_attempts out of bounds");
        assert!(1 <= timeout_seconds && timeout_seconds <= MAX_TIMEOUT_SECONDS, "timeout_seconds out of bounds");
        Limits { max_attempts, timeout_seconds }
    }

    /// What a submitter asked for, on a deployment whose attempts may run at most `longest`
    /// seconds (the default timeout is cut to it).
    pub fn parse(max_attempts: Option<i32>, timeout_seconds: Option<i32>, longest: i32) -> Result<Limits, Invalid> {
        let max_attempts = max_attempts.unwrap_or(DEFAULT_MAX_ATTEMPTS);
        if !(1..=MAX_ATTEMPTS).contains(&max_attempts) {
            return Err(Invalid::MaxAttempts);
        }
        let longest = longest.min(MAX_TIMEOUT_SECONDS);
        let timeout_seconds = timeout_seconds.unwrap_or(DEFAULT_TIMEOUT_SECONDS.min(longest));
        if !(1..=longest).contains(&timeout_seconds) {
            return Err(Invalid::Timeout { longest });
        }
        Ok(Limits { max_attempts, timeout_seconds })
    }

    pub fn max_attempts(self) -> i32 {
        self.max_attempts
    }

    pub fn timeout_seconds(self) -> i32 {
        self.timeout_seconds
    }
}

/// The request a job was made from, hashed (SHA-256): a replay of its idempotency key with
/// other content is refused. Always 32 bytes, so `jobs` needs no length check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestHash([u8; 32]);

impl RequestHash {
    pub fn of(request: &[u8]) -> Self {
        Self(Sha256::digest(request).into())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// No more than `limit` jobs with this key run at once; jobs with other keys or none are not
/// held back. Within bounds by construction, like `Limits`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Concurrency {
    key: String,
    limit: i32,
}

impl Concurrency {
    /// A key and a limit as a client gives them: both or neither.
    pub fn parse(key: Option<String>, limit: Option<i32>) -> Result<Option<Concurrency>, Invalid> {
        match (key, limit) {
            (None, None) => Ok(None),
            (Some(key), Some(limit)) => {
                if !printable(&key) {
                    return Err(Invalid::ConcurrencyKey);
                }
                if !(1..=MAX_CONCURRENCY_LIMIT).contains(&limit) {
                    return Err(Invalid::ConcurrencyLimit);
                }
                Ok(Some(Concurrency { key, limit }))
            }
            (Some(_), None) => Err(Invalid::KeyWithoutLimit),
            (None, Some(_)) => Err(Invalid::LimitWithoutKey),
        }
    }

    /// A campaign's children: `limit` of them send at once (the campaign's parameters hold
    /// it to 1 to 1,000; here it is held to the bounds of any limit).
    pub fn campaign(campaign: JobId, limit: i32) -> Concurrency {
        Concurrency { key: format!("campaign:{campaign}"), limit: limit.clamp(1, MAX_CONCURRENCY_LIMIT) }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn limit(&self) -> i32 {
        self.limit
    }
}

/// What a job's failure (for good) does to the jobs queued behind it on its ordering key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum OnFailure {
    /// They stay pending, held behind it, until it is retried and succeeds, is finished by an
    /// operator, or is cancelled (which cancels them too).
    #[default]
    Hold,
    /// They are cancelled, naming it; jobs submitted to the key afterwards start afresh.
    Cancel,
}

impl OnFailure {
    pub fn as_str(self) -> &'static str {
        match self {
            OnFailure::Hold => "hold",
            OnFailure::Cancel => "cancel",
        }
    }

    pub fn parse(s: &str) -> Option<OnFailure> {
        match s {
            "hold" => Some(OnFailure::Hold),
            "cancel" => Some(OnFailure::Cancel),
            _ => None,
        }
    }
}

/// FIFO per key: jobs of one tenant with one ordering key start in submission order, one at a
/// time, each after the one ahead has succeeded (`store::ordering`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ordering {
    key: String,
    on_failure: OnFailure,
}

impl Ordering {
    /// A key and a policy as a client gives them: the policy only with a key (default `hold`).
    pub fn parse(key: Option<String>, on_failure: Option<OnFailure>) -> Result<Option<Ordering>, Invalid> {
        match (key, on_failure) {
            (None, None) => Ok(None),
            (None, Some(_)) => Err(Invalid::OnFailureWithoutKey),
            (Some(key), on_failure) if printable(&key) => {
                Ok(Some(Ordering { key, on_failure: on_failure.unwrap_or_default() }))
            }
            (Some(_), _) => Err(Invalid::OrderingKey),
        }
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    pub fn on_failure(&self) -> OnFailure {
        self.on_failure
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().with_timezone(&Utc)
    }

    #[test]
    fn idempotency_keys_are_bounded_visible_ascii() {
        assert_eq!(IdempotencyKey::parse("order-42").unwrap().as_str(), "order-42");
        for bad in ["", "has space", "tab\t", "é", &"k".repeat(201)] {
            assert_eq!(IdempotencyKey::parse(bad), Err(Invalid::IdempotencyKey), "{bad:?}");
        }
        assert!(IdempotencyKey::parse(&"k".repeat(200)).is_ok());
    }

    #[test]
    fn an_ordering_policy_needs_a_key_and_holds_by_default() {
        let o = Ordering::parse(Some("user-1".into()), None).unwrap().unwrap();
        assert_eq!((o.key(), o.on_failure()), ("user-1", OnFailure::Hold));
        let c = Ordering::parse(Some("u".into()), Some(OnFailure::Cancel)).unwrap().unwrap();
        assert_eq!(c.on_failure(), OnFailure::Cancel);
        assert_eq!(Ordering::parse(None, None), Ok(None));
        assert_eq!(Ordering::parse(None, Some(OnFailure::Hold)), Err(Invalid::OnFailureWithoutKey));
        for bad in ["", "a\nb", &"k".repeat(201)] {
            assert_eq!(Ordering::parse(Some(bad.into()), None), Err(Invalid::OrderingKey), "{bad:?}");
        }
        assert_eq!(OnFailure::parse(OnFailure::Cancel.as_str()), Some(OnFailure::Cancel));
    }

    #[test]
    fn slot_keys_name_their_schedule() {
        let id = Uuid::now_v7();
        let key = IdempotencyKey::schedule_slot(id, t("2024-01-01T10:00:00Z"));
        assert_eq!(key.as_str(), format!("schedule:{id}:2024-01-01T10:00:00Z"));
        assert_eq!(IdempotencyKey::parse(key.as_str()).as_ref(), Ok(&key), "a slot key is a valid key");
        assert_eq!(IdempotencyKey::schedule_of(key.as_str()), Some(id));
        assert_eq!(IdempotencyKey::schedule_of("order-7"), None);
        assert_eq!(IdempotencyKey::schedule_of("schedule:nightly:2024"), None);
    }

    #[test]
    fn provider_keys_are_bounded() {
        assert_eq!(IdempotencyKey::provider_message("sns", "m-1").unwrap().as_str(), "sns:m-1");
        assert!(IdempotencyKey::provider_message("sqs", &"m".repeat(196)).is_some());
        assert!(IdempotencyKey::provider_message("sqs", &"m".repeat(197)).is_none());
    }

    #[test]
    fn correlation_ids_are_bounded_and_printable() {
        assert!(CorrelationId::parse("order 42 é").is_ok());
        for bad in ["", "line\nbreak", &"c".repeat(201)] {
            assert_eq!(CorrelationId::parse(bad), Err(Invalid::CorrelationId), "{bad:?}");
        }
        let slot = CorrelationId::schedule_slot("nightly", t("2024-01-01T10:00:00Z"));
        assert_eq!(String::from(slot), "schedule:nightly:2024-01-01T10:00:00Z");
    }

    #[test]
    fn a_job_is_due_now_or_later() {
        let now = t("2024-01-01T00:00:00Z");
        assert_eq!(due_at(None, None, now), Ok(now));
        assert_eq!(due_at(Some(t("2023-01-01T00:00:00Z")), None, now), Ok(now), "the past is now");
        assert_eq!(due_at(None, Some(60), now), Ok(t("2024-01-01T00:01:00Z")));
        assert_eq!(due_at(Some(now), Some(1), now), Err(Invalid::RunAtAndDelay));
        assert_eq!(due_at(None, Some(MAX_DELAY_SECONDS + 1), now), Err(Invalid::DelayTooLong));
        assert_eq!(
            due_at(Some(t("2125-06-01T00:00:00Z")), None, now),
            Ok(t("2125-06-01T00:00:00Z")),
            "a time is taken as given"
        );
    }

    #[test]
    fn limits_default_and_hold_their_bounds() {
        assert_eq!(Limits::parse(None, None, MAX_TIMEOUT_SECONDS), Ok(Limits::DEFAULT));
        assert_eq!(
            Limits::parse(None, None, 60),
            Ok(Limits { max_attempts: 5, timeout_seconds: 60 }),
            "the default is cut to the deployment's"
        );
        assert_eq!(Limits::parse(Some(0), None, MAX_TIMEOUT_SECONDS), Err(Invalid::MaxAttempts));
        assert_eq!(Limits::parse(Some(101), None, MAX_TIMEOUT_SECONDS), Err(Invalid::MaxAttempts));
        assert_eq!(Limits::parse(None, Some(61), 60), Err(Invalid::Timeout { longest: 60 }));
        assert_eq!(
            Limits::parse(None, Some(0), MAX_TIMEOUT_SECONDS),
            Err(Invalid::Timeout { longest: MAX_TIMEOUT_SECONDS })
        );
        // A deployment configured past the bound still makes no job past it (`jobs` has no check).
        assert_eq!(
            Limits::parse(None, Some(MAX_TIMEOUT_SECONDS + 1), i32::MAX),
            Err(Invalid::Timeout { longest: MAX_TIMEOUT_SECONDS })
        );
        assert_eq!(
            Invalid::Timeout { longest: MAX_TIMEOUT_SECONDS }.to_string(),
            "timeout_seconds: between 1 and 86400"
        );
        assert!(
            Invalid::Timeout { longest: 60 }
                .to_string()
                .starts_with("timeout_seconds: between 1 and 60 on this deployment: ")
        );
    }

    #[test]
    fn concurrency_takes_both_or_neither() {
        assert_eq!(Concurrency::parse(None, None), Ok(None));
        assert_eq!(Concurrency::parse(Some("k".into()), Some(3)), Ok(Some(Concurrency { key: "k".into(), limit: 3 })));
        assert_eq!(Concurrency::parse(Some("k".into()), None), Err(Invalid::KeyWithoutLimit));
        assert_eq!(Concurrency::parse(None, Some(3)), Err(Invalid::LimitWithoutKey));
        assert_eq!(Concurrency::parse(Some(String::new()), Some(3)), Err(Invalid::ConcurrencyKey));
        assert_eq!(Concurrency::parse(Some("k".into()), Some(10_001)), Err(Invalid::ConcurrencyLimit));
        assert_eq!(Invalid::KeyWithoutLimit.field(), "concurrency_limit", "the missing one is named");
    }

    #[test]
    fn terms_made_by_relay_itself_hold_the_bounds_the_table_no_longer_checks() {
        let campaign = JobId::new();
        assert_eq!(Concurrency::campaign(campaign, 0).limit(), 1);
        assert_eq!(Concurrency::campaign(campaign, i32::MAX).limit(), MAX_CONCURRENCY_LIMIT);
        assert!(printable(Concurrency::campaign(campaign, 10).key()));
        assert_eq!(RequestHash::of(b"").as_bytes().len(), 32);
        let longest_name = "n".repeat(100);
        let slot = t("2026-01-01T00:00:00Z");
        assert!(CorrelationId::parse(CorrelationId::schedule_slot(&longest_name, slot).as_str()).is_ok());
        let key = IdempotencyKey::parse(&"k".repeat(MAX_KEY_LEN)).unwrap();
        assert!(CorrelationId::parse(CorrelationId::of_key(&key).as_str()).is_ok());
        assert!(IdempotencyKey::parse(IdempotencyKey::exception_alert(Uuid::now_v7()).as_str()).is_ok());
        assert!(CorrelationId::parse(CorrelationId::exception_alert(Uuid::now_v7()).as_str()).is_ok());
        assert!(IdempotencyKey::parse(IdempotencyKey::campaign_child(campaign, usize::MAX).as_str()).is_ok());
    }

    #[test]
    #[should_panic(expected = "max_attempts out of bounds")]
    fn fixed_limits_out_of_bounds_are_refused() {
        let _ = Limits::fixed(MAX_ATTEMPTS + 1, 60);
    }
}
