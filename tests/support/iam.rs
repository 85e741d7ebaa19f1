//! IAM policy evaluation for the template's policies, written out because moto does not enforce
//! IAM. The subset Relay's policies use, each rule as the IAM user guide's "policy evaluation
//! logic" states it:
//! - an explicit `Deny` wins; else any matching `Allow`; else the request is implicitly denied;
//! - `Action` and `Resource` match with `*` (any run, empty included) and `?` (one character);
//!   actions case-insensitively, resources as written;
//! - policy variables (`${aws:PrincipalTag/relay:tenant}`) in `Resource` and in condition values
//!   are replaced from the request context; one the context lacks makes that entry match nothing;
//! - `Condition`: every operator and every key in it must hold (AND), a key matches when any of
//!   its values matches (OR); a key absent from the context fails a positive operator, passes a
//!   negated one (`StringNotEquals`, `ArnNotLike`), and passes any operator ending `IfExists`;
//! - a request naming several resources (an SES send: the identity and the configuration set)
//!   is allowed only when each one is.
//!
//! Anything else (`NotAction`, `NotResource`, `NotPrincipal`, another operator) panics: a policy
//! that uses it needs this file extended first, never silently passed.

use std::collections::BTreeMap;

use serde_json::Value;

/// One resource of a request with the context keys that hold for it (`aws:PrincipalTag/..`,
/// `aws:ResourceTag/..`, `aws:SourceArn` ...).
#[derive(Debug, Clone)]
pub struct Request {
    pub action: String,
    pub resource: String,
    pub context: BTreeMap<String, String>,
}

impl Request {
    pub fn new(action: &str, resource: &str, context: &[(&str, &str)]) -> Request {
        Request {
            action: action.to_owned(),
            resource: resource.to_owned(),
            context: context.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    Allow,
    ExplicitDeny,
    ImplicitDeny,
}

/// The decision for one request against these statements (one policy or several, joined).
pub fn evaluate(statements: &[Value], req: &Request) -> Decision {
    let mut allowed = false;
    for s in statements {
        for unsupported in ["NotAction", "NotResource", "NotPrincipal"] {
            assert!(s.get(unsupported).is_none(), "{unsupported} is not evaluated here: {s}");
        }
        let applies = list(&s["Action"]).iter().any(|a| wildcard(&a.to_lowercase(), &req.action.to_lowercase()))
            && list(&s["Resource"])
                .iter()
                .any(|r| substitute(r, &req.context).is_some_and(|r| wildcard(&r, &req.resource)))
            && conditions_hold(&s["Condition"], &req.context);
        match (applies, s["Effect"].as_str()) {
            (false, _) => {}
            (true, Some("Deny")) => return Decision::ExplicitDeny,
            (true, Some("Allow")) => allowed = true,
            (true, other) => panic!("an Effect of Allow or Deny, not {other:?}"),
        }
    }
    if allowed { Decision::Allow } else { Decision::ImplicitDeny }
}

/// Allowed only when every resource of the request is.
pub fn allows_all(statements: &[Value], requests: &[Request]) -> bool {
    !requests.is_empty() && requests.iter().all(|r| evaluate(statements, r) == Decision::Allow)
}

fn list(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().map(|x| x.as_str().unwrap_or_else(|| panic!("a string: {x}")).to_owned()).collect(),
        Value::Null => Vec::new(),
        other => panic!("a string or a list of strings, not {other}"),
    }
}

/// `*` and `?` wildcards over the whole text.
fn wildcard(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    // The classic two-pointer match with backtracking to the last star.
    let (mut i, mut j, mut star, mut mark) = (0, 0, None, 0);
    while j < t.len() {
        if i < p.len() && (p[i] == '?' || p[i] == t[j]) {
            i += 1;
            j += 1;
        } else if i < p.len() && p[i] == '*' {
            star = Some(i);
            mark = j;
            i += 1;
        } else if let Some(s) = star {
            i = s + 1;
            mark += 1;
            j = mark;
        } else {
            return false;
        }
    }
    p[i..].iter().all(|c| *c == '*')
}

/// Replace `${key}` from the context (`${*}`, `${?}`, `${$}`: the literal character); `None`
/// when a key is absent.
fn substitute(text: &str, context: &BTreeMap<String, String>) -> Option<String> {
    let mut out = String::new();
    let mut rest = text;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let end = rest[at..].find('}').map(|e| at + e).unwrap_or_else(|| panic!("an unclosed variable in {text}"));
        let key = &rest[at + 2..end];
        match key {
            "*" | "?" | "$" => out.push_str(key),
            _ => out.push_str(context.get(key)?),
        }
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

fn conditions_hold(condition: &Value, context: &BTreeMap<String, String>) -> bool {
    let Some(ops) = condition.as_object() else {
        assert!(condition.is_null(), "a Condition is an object: {condition}");
        return true;
    };
    ops.iter().all(|(op, keys)| {
        let (base, if_exists) = match op.strip_suffix("IfExists") {
            Some(b) => (b, true),
            None => (op.as_str(), false),
        };
        let (negated, matches): (bool, fn(&str, &str) -> bool) = match base {
            "StringEquals" | "ArnEquals" => (false, |p, v| p == v),
            "StringLike" | "ArnLike" => (false, wildcard),
            "StringNotEquals" | "ArnNotEquals" => (true, |p, v| p == v),
            "StringNotLike" | "ArnNotLike" => (true, wildcard),
            other => panic!("the condition operator {other} is not evaluated here"),
        };
        keys.as_object().unwrap_or_else(|| panic!("{op}: keys and values")).iter().all(|(key, values)| {
            let Some(actual) = context.get(key) else { return if_exists || negated };
            let any = list(values).iter().any(|p| substitute(p, context).is_some_and(|p| matches(&p, actual)));
            any != negated
        })
    })
}

/// The evaluator's own cases, each a rule from the module comment (run by `policies::`).
pub fn self_check() {
    use serde_json::json;
    let tagged = json!([{
        "Effect": "Allow", "Action": "secretsmanager:GetSecretValue",
        "Resource": "arn:aws:secretsmanager:*:1:secret:t/${aws:PrincipalTag/t}/*"
    }]);
    let a = [("aws:PrincipalTag/t", "a")];
    let req = |res: &str, ctx: &[(&str, &str)]| Request::new("secretsmanager:GetSecretValue", res, ctx);
    let s = tagged.as_array().unwrap();
    assert_eq!(evaluate(s, &req("arn:aws:secretsmanager:r:1:secret:t/a/x", &a)), Decision::Allow);
    assert_eq!(evaluate(s, &req("arn:aws:secretsmanager:r:1:secret:t/b/x", &a)), Decision::ImplicitDeny);
    assert_eq!(evaluate(s, &req("arn:aws:secretsmanager:r:1:secret:t/a/x", &[])), Decision::ImplicitDeny, "no tag");
    let action = Request::new("SecretsManager:getsecretvalue", "arn:aws:secretsmanager:r:1:secret:t/a/x", &a);
    assert_eq!(evaluate(s, &action), Decision::Allow, "actions match case-insensitively");
    assert_eq!(
        evaluate(s, &Request { action: "secretsmanager:PutSecretValue".into(), ..action }),
        Decision::ImplicitDeny
    );

    let deny = json!([{"Effect": "Allow", "Action": "ses:*", "Resource": "*"},
                      {"Effect": "Deny", "Action": "ses:SendEmail", "Resource": "arn:x:?"}]);
    let d = deny.as_array().unwrap();
    assert_eq!(evaluate(d, &Request::new("ses:SendEmail", "arn:x:1", &[])), Decision::ExplicitDeny);
    assert_eq!(evaluate(d, &Request::new("ses:SendEmail", "arn:x:12", &[])), Decision::Allow, "? is one character");

    let cond = json!([{
        "Effect": "Allow", "Action": "ses:SendEmail", "Resource": "*",
        "Condition": {"StringEquals": {"aws:ResourceTag/t": "${aws:PrincipalTag/t}"},
                      "StringLikeIfExists": {"ses:FromAddress": ["*@a.example", "*@b.example"]}}
    }]);
    let c = cond.as_array().unwrap();
    let send = |ctx: &[(&str, &str)]| evaluate(c, &Request::new("ses:SendEmail", "arn:id", ctx));
    assert_eq!(send(&[("aws:PrincipalTag/t", "a"), ("aws:ResourceTag/t", "a")]), Decision::Allow);
    assert_eq!(send(&[("aws:PrincipalTag/t", "a"), ("aws:ResourceTag/t", "b")]), Decision::ImplicitDeny);
    assert_eq!(send(&[("aws:PrincipalTag/t", "a")]), Decision::ImplicitDeny, "an untagged resource");
    assert_eq!(send(&[("aws:ResourceTag/t", "a")]), Decision::ImplicitDeny, "an untagged session");
    let both = [("aws:PrincipalTag/t", "a"), ("aws:ResourceTag/t", "a"), ("ses:FromAddress", "x@b.example")];
    assert_eq!(send(&both), Decision::Allow, "IfExists: present and matching one of the values");
    let wrong = [("aws:PrincipalTag/t", "a"), ("aws:ResourceTag/t", "a"), ("ses:FromAddress", "x@c.example")];
    assert_eq!(send(&wrong), Decision::ImplicitDeny, "every operator must hold");

    let not = json!([{"Effect": "Allow", "Action": "sqs:SendMessage", "Resource": "*",
                      "Condition": {"ArnNotLike": {"aws:SourceArn": "arn:sns:*:bad-*"}}}]);
    let n = not.as_array().unwrap();
    let from = |arn: &str| evaluate(n, &Request::new("sqs:SendMessage", "q", &[("aws:SourceArn", arn)]));
    assert_eq!((from("arn:sns:r:bad-1"), from("arn:sns:r:good")), (Decision::ImplicitDeny, Decision::Allow));
    assert_eq!(evaluate(n, &Request::new("sqs:SendMessage", "q", &[])), Decision::Allow, "negated: absent passes");

    // Several resources: all or nothing.
    let one = json!([{"Effect": "Allow", "Action": "ses:SendEmail", "Resource": "arn:identity/a"}]);
    let o = one.as_array().unwrap();
    let id = Request::new("ses:SendEmail", "arn:identity/a", &[]);
    let set = Request::new("ses:SendEmail", "arn:configuration-set/s", &[]);
    assert!(allows_all(o, std::slice::from_ref(&id)));
    assert!(!allows_all(o, &[id, set]));
    assert!(!allows_all(o, &[]));
}
