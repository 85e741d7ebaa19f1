//! Pure naming for role sessions: the session name (job id and attempt, valid for STS) and the
//! session tags (tenant, task type, job, attempt). No I/O.
//!
//! STS accepts a role session name of 2–64 characters of `[\w+=,.@-]`; CloudTrail shows it in
//! every entry the session makes, so it carries the job id exactly as the API prints it.

use sha2::{Digest, Sha256};

use crate::job::{JobId, TenantId};

pub const MIN_NAME: usize = 2;
pub const MAX_NAME: usize = 64;

/// Whether STS accepts `name` as a role session name.
pub fn is_valid_session_name(name: &str) -> bool {
    (MIN_NAME..=MAX_NAME).contains(&name.len()) && name.chars().all(is_name_char)
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || "_+=,.@-".contains(c)
}

/// The session name of one attempt: `relay-<job id>-<attempt>` (at most 53 characters for a
/// UUID and an `i32`, so in practice never shortened).
pub fn session_name(job_id: JobId, attempt: i32) -> String {
    sanitize(&format!("relay-{job_id}-{attempt}"))
}

/// Any text as a valid session name: characters STS refuses become `-`; text over 64
/// characters keeps its first 47 and ends with `-` and 16 hex digits of its SHA-256, so two
/// long names that share a prefix still differ; text under 2 characters is padded with `-`.
pub fn sanitize(raw: &str) -> String {
    let mut name: String = raw.chars().map(|c| if is_name_char(c) { c } else { '-' }).collect();
    if name.len() > MAX_NAME {
        let digest = hex::encode(&Sha256::digest(raw.as_bytes())[..8]);
        name = format!("{}-{digest}", &name[..MAX_NAME - 17]);
    }
    while name.len() < MIN_NAME {
        name.push('-');
    }
    name
}

/// A session tag value as STS accepts it (letters, digits, spaces and `_.:/=+-@`, at most
/// 256 characters); anything else becomes `_`.
pub fn tag_value(raw: &str) -> String {
    raw.chars()
        .map(|c| if c.is_alphanumeric() || c == ' ' || "_.:/=+-@".contains(c) { c } else { '_' })
        .take(256)
        .collect()
}

/// The session tags of one attempt, so CloudTrail names tenant, task type, job and attempt.
pub fn session_tags(tenant_id: TenantId, task_type: &str, job_id: JobId, attempt: i32) -> Vec<(&'static str, String)> {
    vec![
        ("relay:tenant", tenant_id.to_string()),
        ("relay:task_type", tag_value(task_type)),
        ("relay:job_id", job_id.to_string()),
        ("relay:attempt", attempt.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::Rng;

    #[test]
    fn ten_thousand_job_ids_and_attempts_give_valid_names_that_carry_the_id() {
        let mut rng = rand::rng();
        let edge = [1, 2, 99, 100, i32::MAX, 0, -1, i32::MIN];
        for i in 0..10_000 {
            let id =
                JobId::from_uuid(if i % 2 == 0 { uuid::Uuid::now_v7() } else { uuid::Uuid::from_u128(rng.random()) });
            let attempt = if i < edge.len() { edge[i] } else { rng.random_range(1..=100) };
            let name = session_name(id, attempt);
            assert!(is_valid_session_name(&name), "{name}");
            assert!(name.contains(&id.to_string()), "{name} carries the job id");
            assert!(name.ends_with(&format!("-{attempt}")), "{name} carries the attempt");
        }
    }

    #[test]
    fn long_or_odd_text_is_made_valid_and_stays_distinct() {
        let a = sanitize(&format!("{}a", "x".repeat(100)));
        let b = sanitize(&format!("{}b", "x".repeat(100)));
        assert!(is_valid_session_name(&a) && is_valid_session_name(&b));
        assert_eq!(a.len(), 64);
        assert_ne!(a, b, "names that differ only past the cut differ by their hash");
        assert_eq!(sanitize("a b/c:d"), "a-b-c-d");
        assert_eq!(sanitize(""), "--");
        assert!(is_valid_session_name(&sanitize("é")));
        let mut rng = rand::rng();
        for _ in 0..1000 {
            let len = rng.random_range(0..200);
            let raw: String = (0..len).map(|_| char::from_u32(rng.random_range(1..0x3000)).unwrap_or('?')).collect();
            assert!(is_valid_session_name(&sanitize(&raw)), "{raw:?}");
        }
    }

    #[test]
    fn tags_name_tenant_task_type_job_and_attempt() {
        let (t, j) = (TenantId::new(), JobId::new());
        let tags = session_tags(t, "email.send", j, 3);
        assert_eq!(tags[0], ("relay:tenant", t.to_string()));
        assert_eq!(tags[1], ("relay:task_type", "email.send".to_owned()));
        assert_eq!(tags[3], ("relay:attempt", "3".to_owned()));
        assert_eq!(tag_value("a\u{0}b#c"), "a_b_c");
    }
}
