//! A call's answer as Relay keeps it: the destination's secrets taken out (`redact`), the
//! record's JSON (`response_json`), and the one classification of a call's end (`classify`,
//! the table in `super::call`), with the destination's or the job's success rule
//! (`super::success`).

use serde_json::{Value, json};

use super::success::{SuccessRule, Verdict};
use crate::job::TaskError;
use crate::outbound::{self, Answer};
use crate::store::http_calls::Settled;

/// The answer headers recorded with the result.
pub const RECORDED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "location",
    "etag",
    "last-modified",
    "retry-after",
    "request-id",
    "x-request-id",
];
/// What an ambiguous call's error tells the tenant: the destination is its own, so is the call.
pub const DECIDE: &str =
    "The destination is yours: check whether it acted, and submit again (a new idempotency key) if it did not.";
/// Shown in place of the secret wherever a request is recorded.
pub const REDACTED: &str = "<redacted>";
/// Whether an answer's status makes the call worth another attempt (its body is not read).
pub(crate) fn retryable_status(status: u16) -> bool {
    matches!(status, 408 | 429 | 500..=599)
}

/// The answer with the destination's secret taken out of its body and headers: a destination
/// may echo what it was sent (an error page quoting the request's headers), and everything
/// recorded of a call (its record, the job's error and events, exceptions, logs) comes from
/// here. The secret is replaced as sent, JSON-escaped, and, at the end of a body cut at the
/// limit, as the start of it. Each of `secrets` is (the auth header's value, and a minted
/// token on its own), the longest first.
pub(crate) fn redact(mut a: Answer, secrets: &[&str]) -> Answer {
    let mut secrets: Vec<&str> = secrets.iter().copied().filter(|s| !s.is_empty()).collect();
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    for secret in secrets {
        a = redact_one(a, secret);
    }
    a
}

fn redact_one(mut a: Answer, secret: &str) -> Answer {
    let quoted = serde_json::to_string(secret).unwrap_or_default();
    let escaped = quoted.strip_prefix('"').and_then(|q| q.strip_suffix('"')).unwrap_or(secret);
    let mut forms = vec![secret.as_bytes()];
    if escaped != secret {
        forms.push(escaped.as_bytes());
    }
    let scrub = |bytes: &[u8]| -> Vec<u8> {
        let mut out = bytes.to_vec();
        for form in &forms {
            out = replace_all(&out, form, REDACTED.as_bytes());
        }
        out
    };
    a.body = scrub(&a.body);
    if a.truncated || a.cut {
        // A secret cut by the limit leaves its start at the end of what was read.
        let keep = (4..secret.len()).rev().find(|&n| a.body.ends_with(&secret.as_bytes()[..n]));
        if let Some(n) = keep {
            a.body.truncate(a.body.len() - n);
            a.body.extend_from_slice(REDACTED.as_bytes());
        }
    }
    for value in a.headers.values_mut() {
        let scrubbed = scrub(value.as_bytes());
        if scrubbed != value.as_bytes() {
            *value = hyper::header::HeaderValue::from_bytes(&scrubbed)
                .unwrap_or_else(|_| hyper::header::HeaderValue::from_static(REDACTED));
        }
    }
    a
}

fn replace_all(haystack: &[u8], needle: &[u8], with: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(haystack.len());
    let mut i = 0;
    while i < haystack.len() {
        if haystack[i..].starts_with(needle) {
            out.extend_from_slice(with);
            i += needle.len();
        } else {
            out.push(haystack[i]);
            i += 1;
        }
    }
    out
}

/// The answer as recorded: status, recorded headers, the body (JSON when it parses whole, else
/// text; NUL characters replaced, as Postgres stores none).
pub(crate) fn response_json(a: &Answer) -> Value {
    let headers: serde_json::Map<String, Value> = RECORDED_HEADERS
        .iter()
        .filter_map(|h| a.headers.get(*h).map(|v| ((*h).to_owned(), json!(String::from_utf8_lossy(v.as_bytes())))))
        .collect();
    let text = String::from_utf8_lossy(&a.body).replace('\0', "\u{FFFD}");
    let parsed = (!a.truncated && !a.cut).then(|| serde_json::from_str::<Value>(&text).ok()).flatten();
    let body = match parsed {
        Some(v) if !v.to_string().contains("\\u0000") => v,
        _ => json!(text.replace("\\u0000", "\u{FFFD}")),
    };
    json!({"status": a.status, "headers": headers, "body": body, "truncated": a.truncated, "cut": a.cut})
}

/// The one classification of a call's end (see the table in `super::call`), with the success
/// rule (`rule`) judging the answers it covers.
pub(crate) fn classify(
    what: &str,
    answer: Result<Answer, outbound::PostError>,
    duration_ms: Option<i32>,
    rule: Option<&SuccessRule>,
) -> (Settled, Result<Value, TaskError>) {
    let settled = |outcome, http_status, response, error: Option<String>| Settled {
        outcome,
        http_status,
        response,
        error,
        duration_ms,
    };
    let a = match answer {
        Err(e) if e.maybe_sent() => {
            let error = format!("{what}: {e}; the destination may have acted on it: not retried. {DECIDE}");
            return (settled("ambiguous", None, None, Some(error.clone())), Err(TaskError::Ambiguous(error).tenants()));
        }
        Err(e) => {
            let error = format!("{what}: {e}");
            return (settled("retryable", None, None, Some(error.clone())), Err(TaskError::Retryable(error).tenants()));
        }
        Ok(a) => a,
    };
    let response = response_json(&a);
    let status = Some(i32::from(a.status));
    match a.status {
        200..=299 if a.cut => {
            let error = format!(
                "{what}: answered {} but the answer broke off: the call was made; its result is incomplete. {DECIDE}",
                a.status
            );
            (
                settled("ambiguous", status, Some(response), Some(error.clone())),
                Err(TaskError::Ambiguous(error).tenants()),
            )
        }
        s if rule.is_some_and(|r| r.judge(s, None) != Verdict::NotJudged) => {
            let rule = rule.expect("judged by a rule");
            let whole = (!a.truncated && !a.cut).then(|| serde_json::from_slice::<Value>(&a.body).ok()).flatten();
            match rule.judge(s, whole.as_ref()) {
                Verdict::Failed(why) => {
                    let body: String = response["body"].to_string().chars().take(2000).collect();
                    let error = format!("{what}: answered {s}; {why}: {body}");
                    let (outcome, e) = if rule.retry {
                        ("retryable", TaskError::Retryable(error.clone()))
                    } else {
                        ("fatal", TaskError::Fatal(error.clone()))
                    };
                    (settled(outcome, status, Some(response), Some(error)), Err(e.tenants()))
                }
                _ => (settled("succeeded", status, Some(response.clone()), None), Ok(response)),
            }
        }
        200..=299 => (settled("succeeded", status, Some(response.clone()), None), Ok(response)),
        s if retryable_status(s) => {
            let error = format!("{what}: answered {s}");
            let e = match a.retry_after {
                Some(after) => TaskError::RetryAfter(error.clone(), after),
                None => TaskError::Retryable(error.clone()),
            };
            (settled("retryable", status, Some(response), Some(error)), Err(e.tenants()))
        }
        s => {
            let why = if (300..400).contains(&s) { "a redirect (not followed)" } else { "refused" };
            let body: String = response["body"].to_string().chars().take(2000).collect();
            let error = format!("{what}: answered {s}, {why}: {body}");
            (settled("fatal", status, Some(response), Some(error.clone())), Err(TaskError::Fatal(error).tenants()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(body: &str, truncated: bool) -> Answer {
        let mut headers = hyper::HeaderMap::new();
        headers.insert("x-request-id", hyper::header::HeaderValue::from_static("echo Bearer s\"k\\1"));
        Answer { status: 400, retry_after: None, headers, body: body.as_bytes().to_vec(), truncated, cut: false }
    }

    #[test]
    fn the_secret_is_redacted_as_sent_json_escaped_and_cut_at_the_limit() {
        let secret = "Bearer s\"k\\1";
        let a = redact(answer(r#"{"sent": "Bearer s\"k\\1"} raw: Bearer s"k\1 end"#, false), &[secret]);
        let body = String::from_utf8(a.body).unwrap();
        assert_eq!(body, r#"{"sent": "<redacted>"} raw: <redacted> end"#);
        assert_eq!(a.headers["x-request-id"], "echo <redacted>");
        let cut = redact(answer("... authorization: Bearer s\"", true), &[secret]);
        assert_eq!(String::from_utf8(cut.body).unwrap(), "... authorization: <redacted>");
        let untouched = redact(answer("nothing here", false), &[]);
        assert_eq!(untouched.body, b"nothing here");
    }
}
