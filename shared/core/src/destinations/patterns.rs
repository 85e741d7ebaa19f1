//! A destination's URL patterns: the run-time URLs `webhook.send` may POST to. A pattern is
//! `scheme://HOST[:PORT]/PREFIX/`, and a URL matches it when all of these hold:
//!
//! - the scheme is the same (`https`; `http` only for a host on the operator's allow-list);
//! - the port is the same (a pattern with no port: the scheme's default, written or not);
//! - the host: an exact HOST is the same name (any case) or the same address; `*.DOMAIN` is any
//!   host name that ends in `.DOMAIN` with one or more labels before it (not DOMAIN itself);
//!   `*` alone is any host name (never an address literal);
//! - the URL's path starts with PREFIX, which ends in `/` (so `/hooks/` never matches
//!   `/hooks-admin`); a query may follow.
//!
//! Refused as ambiguous: a `*` anywhere but as the whole first label, `*.DOMAIN` with fewer than
//! two labels in DOMAIN (`*.com`), a prefix not ending in `/`, a query, fragment or user info, a
//! `.`/`..` or escaped `/` segment. The address guard still runs on every call, on every address
//! the host resolves to: a pattern says what the tenant allows, the guard what Relay does.

use std::net::IpAddr;

use crate::outbound::{self, AllowList, Target, UrlError};

/// Why a URL pattern, or a run-time URL checked against a destination's patterns, is refused.
/// The message says what to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PatternError {
    #[error("at most {MAX_PATTERN_LEN} characters")]
    TooLong,
    #[error("must start with https:// (or http:// for an allow-listed host)")]
    Scheme,
    #[error("needs a path prefix ending in '/' (at least \"/\")")]
    NoPath,
    #[error("no user info")]
    UserInfo,
    #[error("the port is 1 to 65535")]
    Port,
    #[error("'*.' must be followed by a domain of at least two labels (e.g. *.hooks.example.com)")]
    ShortDomain,
    #[error("'*' stands only as the whole first label of the host ('*' or '*.example.com')")]
    Star,
    #[error("the host is a name (letters, digits, '-', '.'), an address, '*' or '*.domain'")]
    Host,
    #[error("the path prefix ends in '/' (so /hooks/ does not match /hooks-admin)")]
    PrefixEnd,
    #[error("the path prefix has no '*', query or fragment")]
    PrefixChars,
    #[error("the path prefix: {0}")]
    PrefixPath(&'static str),
    #[error("https only (http only for a host on the operator's allow-list)")]
    HttpsOnly,
    #[error(transparent)]
    Url(#[from] UrlError),
    #[error("the path: {0}")]
    Path(&'static str),
    #[error("the destination allows no run-time URL (it has no url_patterns)")]
    NoPatterns,
    #[error("matches none of the destination's url_patterns ({})", .0.join(", "))]
    Unmatched(Vec<String>),
}

/// The most patterns a destination may hold.
pub const MAX_PATTERNS: usize = 20;
/// The longest pattern.
pub const MAX_PATTERN_LEN: usize = 500;

/// The patterns the OpenAPI document states: `https`, a host name (`*`, `*.` and a domain of
/// two or more labels, or a name), an optional port, and a prefix of segments each ending in
/// `/` (no `.`-only segment, no escapes). A subset of what `Pattern::parse` takes: http and
/// address literals depend on the operator's allow-list, which the document cannot know.
pub const SHAPE: &str = concat!(
    "^https://(\\*|\\*\\.([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)+[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?",
    "|([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?\\.)*[A-Za-z]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)",
    "(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?",
    "/([A-Za-z0-9_~!$&'()+,;=:@-][A-Za-z0-9._~!$&'()+,;=:@-]*/)*$"
);

/// One parsed pattern.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    https: bool,
    host: Host,
    port: u16,
    prefix: String,
}

#[derive(Debug, Clone, PartialEq)]
enum Host {
    Any,
    Under(String),
    Exact(String),
}

/// A label of a host name: letters, digits and `-`, 1 to 63, not starting or ending in `-`.
fn label(l: &str) -> bool {
    !l.is_empty()
        && l.len() <= 63
        && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
        && !l.starts_with('-')
        && !l.ends_with('-')
}

/// A host name: labels, the last starting with a letter (so it is never an address).
fn host_name(h: &str) -> bool {
    h.split('.').all(label) && h.rsplit('.').next().is_some_and(|l| l.starts_with(|c: char| c.is_ascii_alphabetic()))
}

fn literal(host: &str) -> Option<IpAddr> {
    host.trim_start_matches('[').trim_end_matches(']').parse().ok()
}

impl Pattern {
    /// Parse a pattern under the operator's allow-list (which decides whether `http` and an
    /// address literal the guard refuses may be named). The message says what to fix.
    pub fn parse(s: &str, allow: &AllowList) -> Result<Pattern, PatternError> {
        if s.len() > MAX_PATTERN_LEN {
            return Err(PatternError::TooLong);
        }
        let lower = s.to_ascii_lowercase();
        let (https, rest) = match (lower.strip_prefix("https://"), lower.strip_prefix("http://")) {
            (Some(r), _) => (true, r),
            (None, Some(r)) => (false, r),
            _ => return Err(PatternError::Scheme),
        };
        let cut = rest.find('/').ok_or(PatternError::NoPath)?;
        let (authority, _) = rest.split_at(cut);
        // The path keeps its case (paths are case-sensitive); the scheme and host do not.
        let prefix = &s[s.len() - (rest.len() - cut)..];
        if authority.contains('@') {
            return Err(PatternError::UserInfo);
        }
        let (host, port) = match authority.rfind(':').filter(|&i| !authority[i..].contains(']')) {
            Some(i) => {
                let port = authority[i + 1..].parse::<u16>().ok().filter(|p| *p > 0).ok_or(PatternError::Port)?;
                (&authority[..i], Some(port))
            }
            None => (authority, None),
        };
        let host = if host == "*" {
            Host::Any
        } else if let Some(domain) = host.strip_prefix("*.") {
            if !host_name(domain) || domain.split('.').count() < 2 {
                return Err(PatternError::ShortDomain);
            }
            Host::Under(domain.to_owned())
        } else if host.contains('*') {
            return Err(PatternError::Star);
        } else if host_name(host) || literal(host).is_some() {
            Host::Exact(host.trim_start_matches('[').trim_end_matches(']').to_owned())
        } else {
            return Err(PatternError::Host);
        };
        if !prefix.ends_with('/') {
            return Err(PatternError::PrefixEnd);
        }
        if prefix.contains('*') || prefix.contains('?') || prefix.contains('#') {
            return Err(PatternError::PrefixChars);
        }
        super::check_path(prefix).map_err(PatternError::PrefixPath)?;
        // The shape and the guard's refusal of a literal address, as for a callback URL.
        let example = match &host {
            Host::Exact(_) => s.to_owned(),
            _ => s.replacen('*', "x", 1),
        };
        outbound::check_url(&example, allow)?;
        let listed = match &host {
            Host::Exact(h) => allow.allows_host(h) || literal(h).is_some_and(|ip| allow.allows_ip(ip)),
            _ => false,
        };
        if !https && !listed {
            return Err(PatternError::HttpsOnly);
        }
        Ok(Pattern { https, host, port: port.unwrap_or(if https { 443 } else { 80 }), prefix: prefix.to_owned() })
    }

    /// Whether `url` (already checked by `outbound::check_url`) matches.
    pub fn matches(&self, url: &Target) -> bool {
        let https = url.uri.scheme_str() == Some("https");
        let host = url.host.to_ascii_lowercase();
        let is_literal = literal(&host).is_some();
        let host_ok = match &self.host {
            Host::Any => !is_literal,
            Host::Under(d) => {
                !is_literal && host.strip_suffix(d.as_str()).is_some_and(|h| h.len() > 1 && h.ends_with('.'))
            }
            Host::Exact(h) => match (literal(h), literal(&host)) {
                (Some(a), Some(b)) => a == b,
                (None, None) => *h == host,
                _ => false,
            },
        };
        let path = url.uri.path();
        https == self.https && url.port == self.port && host_ok && path.starts_with(&self.prefix)
    }
}

/// Check a run-time URL for `webhook.send`: its shape and a literal address under the guard
/// (`outbound::check_url`), no `.`/`..` or escaped `/` in its path; and that one of
/// `patterns` matches it. The patterns are as stored (they were parsed when written).
pub fn check_url(url: &str, patterns: &[String], allow: &AllowList) -> Result<Target, PatternError> {
    outbound::check_url(url, allow)?;
    let target = outbound::parse_url(url)?;
    let path_and_query = target.uri.path_and_query().map_or("/", |p| p.as_str());
    super::check_path(path_and_query).map_err(PatternError::Path)?;
    // A stored pattern that no longer parses (the allow-list changed) matches nothing.
    let allowed = patterns.iter().filter_map(|p| Pattern::parse(p, allow).ok()).any(|p| p.matches(&target));
    if !allowed {
        return Err(if patterns.is_empty() {
            PatternError::NoPatterns
        } else {
            PatternError::Unmatched(patterns.to_vec())
        });
    }
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn allow() -> AllowList {
        AllowList::parse("127.0.0.1/32,hooks.local").unwrap()
    }

    fn ok(pattern: &str, url: &str) -> bool {
        check_url(url, &[pattern.to_owned()], &allow()).is_ok()
    }

    /// What the document states, the route takes (the route takes more: http and addresses
    /// on the allow-list); what the route refuses, the document does too.
    #[test]
    fn the_published_shape_is_a_subset_of_what_parses() {
        let re = regex::Regex::new(SHAPE).unwrap();
        let none = AllowList::default();
        let takes = |p: &str| Pattern::parse(p, &none).is_ok();
        for p in ["https://*/", "https://*.hooks.example.com/in/", "https://a-b.example:65535/v1/x.y/", "https://x/"] {
            assert!(re.is_match(p) && takes(p), "{p}");
        }
        let refused = [
            "",
            "https://",
            "https://*.com/",
            "https://a.*.example.com/",
            "https://x/a",
            "https://x/./",
            "https://x/../",
            "https://x:0/",
            "https://x:65536/",
            "https://-x.example/",
            "https://x-.example/",
            "https://x..y/",
            "https://127.0.0.1/",
            "https://[::1]/",
            "http://x/",
            "https://x/?/",
            "https://x/%2e/",
            "https://u@x/",
            "https://x/a*/",
            "https://1.example.2/",
        ];
        for p in refused {
            assert!(!re.is_match(p), "{p:?} is published as valid");
        }
        let long = format!("https://{}.example/", "a".repeat(64));
        assert!(!re.is_match(&long) && !takes(&long));
    }

    #[test]
    fn patterns_match_exactly_what_they_say() {
        let p = "https://*.hooks.example.com/in/";
        assert!(ok(p, "https://a.hooks.example.com/in/x"));
        assert!(ok(p, "https://A.b.HOOKS.example.com/in/x?y=1"));
        assert!(ok(p, "https://a.hooks.example.com:443/in/"));
        assert!(!ok(p, "https://hooks.example.com/in/x"), "the domain itself");
        assert!(!ok(p, "https://evilhooks.example.com/in/x"));
        assert!(!ok(p, "https://a.hooks.example.com.evil.example/in/x"));
        assert!(!ok(p, "https://a.hooks.example.com/inx"), "a prefix ends at a '/'");
        assert!(!ok(p, "https://a.hooks.example.com/in/../admin"));
        assert!(!ok(p, "https://a.hooks.example.com/in/%2e%2e/admin"));
        assert!(!ok(p, "http://a.hooks.example.com/in/x"), "another scheme");
        assert!(!ok(p, "https://a.hooks.example.com:8443/in/x"), "another port");
        assert!(!ok(p, "https://user@a.hooks.example.com/in/x"));
        assert!(ok("https://*/", "https://any.example.org/a"));
        assert!(!ok("https://*/", "https://93.184.216.34/a"), "'*' is any name, never an address");
        assert!(ok("https://api.example.com:8443/v1/", "https://API.example.com:8443/v1/hook"));
        assert!(!ok("https://api.example.com:8443/v1/", "https://api.example.com/v1/hook"));
        assert!(ok("http://127.0.0.1:9000/h/", "http://127.0.0.1:9000/h/1"));
        assert!(!ok("https://*.hooks.example.com/in/", "https://127.0.0.2/in/"), "loopback literal");
        assert!(check_url("https://a.example.com/", &[], &allow()).is_err());
    }

    #[test]
    fn ambiguous_or_unsafe_patterns_are_refused() {
        for p in [
            "https://*.com/",
            "https://a*.example.com/",
            "https://*.*.example.com/",
            "https://x.*.example.com/",
            "https://*.example.com/hooks",
            "https://*.example.com/h*/",
            "https://*.example.com/?a=/",
            "https://*.example.com",
            "https://u@x.example.com/",
            "ftp://x.example.com/",
            "http://x.example.com/",
            "http://*.hooks.local/",
            "https://127.0.0.2/",
            "https://10.0.0.1/",
            "https://[::1]/",
            "https://x.example.com:0/",
            "https://x.example.com/a/../",
            "https://-x.example.com/",
        ] {
            assert!(Pattern::parse(p, &allow()).is_err(), "{p}");
        }
        for p in ["https://*/", "https://*.hooks.example.com/in/", "http://hooks.local:8080/", "http://127.0.0.1:1/"] {
            assert!(Pattern::parse(p, &allow()).is_ok(), "{p}");
        }
    }
}
