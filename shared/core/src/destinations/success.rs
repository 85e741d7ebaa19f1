//! A success rule: which answers of a destination count as success, beyond "any 2xx". Set on
//! the destination (`success`) or on one `http.request` job (its `success`, which wins). Slack's
//! Web API answers `200 {"ok": false, "error": …}`: the rule `{"json": {"pointer": "/ok",
//! "equals": true}}` makes that a failure.
//!
//! An answer is judged when its status is one of `statuses` (default: any 2xx): it succeeds
//! when the JSON check holds (or there is none), else the rule failed. A 2xx not among
//! `statuses` fails the rule too. Any other status keeps the one classification
//! (`call`'s table: 408/429/5xx retried, other 4xx fatal). A failed rule is the tenant's fault,
//! retried when `retry` is true (else the job fails), and its answer is kept in the call's
//! record and the job's error.

pub use crate::store::destination_terms::{JsonCheck, SuccessRule};
use serde_json::Value;

/// The most statuses a rule lists.
pub const MAX_STATUSES: usize = 20;
/// The longest JSON pointer taken.
pub const MAX_POINTER_LEN: usize = 256;
/// The largest expected value, as compact JSON.
pub const MAX_VALUE_LEN: usize = 1024;

/// What the rule says of an answer.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Success,
    /// The rule failed: why.
    Failed(String),
    /// Not the rule's to judge (a status outside its statuses that is no 2xx).
    NotJudged,
}

/// Why a success rule is refused; the message leads with the rule's field at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RuleError {
    #[error("statuses: 1 to {MAX_STATUSES} statuses (absent: any 2xx)")]
    StatusCount,
    #[error("statuses: {0} is not an HTTP status (100 to 599)")]
    NotAStatus(u16),
    #[error("json.pointer: {0}")]
    Pointer(&'static str),
    #[error("json.equals: at most {MAX_VALUE_LEN} bytes of JSON")]
    EqualsTooLarge,
}

impl SuccessRule {
    /// The rule's own checks (`field` names it in the message).
    pub fn check(&self) -> Result<(), RuleError> {
        if let Some(s) = &self.statuses {
            if s.is_empty() || s.len() > MAX_STATUSES {
                return Err(RuleError::StatusCount);
            }
            if let Some(bad) = s.iter().find(|c| !(100..=599).contains(*c)) {
                return Err(RuleError::NotAStatus(*bad));
            }
        }
        if let Some(j) = &self.json {
            check_pointer(&j.pointer).map_err(RuleError::Pointer)?;
            let size = serde_json::to_vec(&j.equals).map_or(usize::MAX, |b| b.len());
            if size > MAX_VALUE_LEN {
                return Err(RuleError::EqualsTooLarge);
            }
        }
        Ok(())
    }

    /// Judge an answer: its status, and its body when it parsed whole as JSON.
    pub fn judge(&self, status: u16, body: Option<&Value>) -> Verdict {
        let listed = self.statuses.as_ref().map_or((200..300).contains(&status), |s| s.contains(&status));
        if !listed {
            return if (200..300).contains(&status) {
                Verdict::Failed(format!("the success rule: status {status} is not one of {:?}", self.statuses))
            } else {
                Verdict::NotJudged
            };
        }
        let Some(j) = &self.json else { return Verdict::Success };
        let Some(body) = body else {
            return Verdict::Failed("the success rule: the answer is not JSON (or was cut at the limit)".into());
        };
        match body.pointer(&j.pointer) {
            Some(v) if *v == j.equals => Verdict::Success,
            Some(v) => Verdict::Failed(format!("the success rule: {} is {v}, not {}", j.pointer, j.equals)),
            None => Verdict::Failed(format!("the success rule: the answer has no {}", j.pointer)),
        }
    }
}

/// An RFC 6901 pointer: `/` then reference tokens, `~` only as `~0` or `~1`; no control
/// characters; at most `MAX_POINTER_LEN` (the whole document, `""`, is refused: nothing to check).
pub fn check_pointer(p: &str) -> Result<(), &'static str> {
    if p.is_empty() || p.len() > MAX_POINTER_LEN || !p.starts_with('/') {
        return Err("a JSON pointer: '/' and a path, 2 to 256 characters (e.g. /ok)");
    }
    let bytes = p.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if b.is_ascii_control() {
            return Err("no control characters");
        }
        if *b == b'~' && !matches!(bytes.get(i + 1), Some(b'0' | b'1')) {
            return Err("'~' only as ~0 ('~') or ~1 ('/')");
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn slack() -> SuccessRule {
        SuccessRule {
            statuses: None,
            json: Some(JsonCheck { pointer: "/ok".into(), equals: json!(true) }),
            retry: false,
        }
    }

    #[test]
    fn a_slack_style_answer_is_judged_by_its_body() {
        let r = slack();
        assert_eq!(r.judge(200, Some(&json!({"ok": true}))), Verdict::Success);
        assert!(
            matches!(r.judge(200, Some(&json!({"ok": false, "error": "x"}))), Verdict::Failed(m) if m.contains("/ok is false"))
        );
        assert!(matches!(r.judge(200, Some(&json!({"ok": "true"}))), Verdict::Failed(_)), "a string is not true");
        assert!(matches!(r.judge(200, Some(&json!({}))), Verdict::Failed(m) if m.contains("no /ok")));
        assert!(matches!(r.judge(200, None), Verdict::Failed(_)));
        assert_eq!(r.judge(500, Some(&json!({"ok": true}))), Verdict::NotJudged, "a 5xx keeps its own classification");
        let listed = SuccessRule { statuses: Some(vec![200, 409]), json: None, retry: false };
        assert_eq!(listed.judge(409, None), Verdict::Success);
        assert!(matches!(listed.judge(202, None), Verdict::Failed(_)));
        assert_eq!(listed.judge(404, None), Verdict::NotJudged);
    }

    #[test]
    fn rules_are_checked() {
        assert!(slack().check().is_ok());
        for p in ["", "ok", "/a~2", "/a~", "/a\nb", &format!("/{}", "x".repeat(256))] {
            assert!(check_pointer(p).is_err(), "{p:?}");
        }
        for p in ["/ok", "/a~0b/~1c", "/data/0/status", "/"] {
            assert!(check_pointer(p).is_ok(), "{p:?}");
        }
        let bad = [
            SuccessRule { statuses: Some(vec![]), json: None, retry: false },
            SuccessRule { statuses: Some(vec![99]), json: None, retry: false },
            SuccessRule { statuses: Some(vec![200; 21]), json: None, retry: false },
            SuccessRule {
                statuses: None,
                json: Some(JsonCheck { pointer: "/ok".into(), equals: json!("x".repeat(2000)) }),
                retry: false,
            },
        ];
        for r in bad {
            assert!(r.check().is_err(), "{r:?}");
        }
    }
}
