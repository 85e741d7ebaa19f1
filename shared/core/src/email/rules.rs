//! What the email tasks' checks refuse that a client can know from the parameters alone, as the
//! rules of their published parameter schemas (`Task::schema_rules`: `GET /v1/tasks`, and the
//! schema intake validates first), and the tenant's sending identities as a rule on `from`
//! (published per tenant by `GET /v1/tasks`; the send checks them again when it runs).
//!
//! Every rule here is necessary: what `SendParams::check` and `CampaignParams::check` take, the
//! rule takes. `format: email` is an annotation for the server's validator (the address parser in
//! `content` decides) and an assertion for a client's (an address has an `@`).

use serde_json::{Value, json};

use super::campaign::MAX_INLINE;
use super::content::{MAX_RECIPIENTS, RESERVED_TAG_PREFIX, TAG_PATTERN};
use crate::store::templates::NAME_PATTERN as TEMPLATE_NAME;

/// `email.send`'s parameters: addresses, at most `MAX_RECIPIENTS` in a list and at least one
/// recipient, a template's name, tags.
pub fn send(schema: &mut Value) {
    message(schema);
    let one = |list: &str| json!({"required": [list], "properties": {list: {"minItems": 1}}});
    schema["anyOf"] = json!([one("to"), one("cc"), one("bcc")]);
}

/// `email.campaign`'s: its message's rules, no recipient in the message, the recipients' own
/// addresses, how many inline and how many pages.
pub fn campaign(schema: &mut Value) {
    if let Some(m) = schema.pointer_mut("/$defs/SendParams") {
        message(m);
        for list in ["to", "cc", "bcc"] {
            m["properties"][list]["maxItems"] = json!(0);
        }
    }
    if let Some(to) = schema.pointer_mut("/$defs/Recipient/properties/to") {
        to["format"] = json!("email");
    }
    schema["properties"]["recipients"]["maxItems"] = json!(MAX_INLINE);
}

/// The rules of one message (`SendParams::check_fields`).
fn message(p: &mut Value) {
    let props = &mut p["properties"];
    props["from"]["format"] = json!("email");
    for list in ["to", "cc", "bcc", "reply_to"] {
        props[list]["items"]["format"] = json!("email");
    }
    for list in ["to", "cc", "bcc"] {
        props[list]["maxItems"] = json!(MAX_RECIPIENTS);
    }
    props["template"]["pattern"] = json!(TEMPLATE_NAME);
    let reserved = format!("^{RESERVED_TAG_PREFIX}");
    props["tags"]["propertyNames"] = json!({"pattern": TAG_PATTERN, "not": {"pattern": reserved}});
    props["tags"]["additionalProperties"] = json!({"type": "string", "pattern": TAG_PATTERN});
}

/// A pattern a `from` matches when it is at one of `identities` (addresses, or domains whose
/// every address may send), in any letter case, with or without a display name. Wider than the
/// send's own check (`store::send_reads`' `allowed` on the bare address), never narrower: the
/// bare address ends the field, before `>` and white space. None for a tenant with none (every
/// send is refused when it runs; the published schema says nothing about it).
pub fn identities_pattern(identities: &[String]) -> Option<String> {
    if identities.is_empty() {
        return None;
    }
    // Letters in either case; other ASCII as itself (escaped); beyond ASCII any character, as
    // the send lower-cases Unicode (wider, never narrower).
    let escape = |s: &str| -> String {
        s.chars()
            .map(|c| match c {
                c if c.is_ascii_alphabetic() => format!("[{}{}]", c.to_ascii_uppercase(), c.to_ascii_lowercase()),
                c if c.is_ascii_alphanumeric() || c == '-' || c == '_' => c.to_string(),
                c if c.is_ascii() => format!("\\{c}"),
                _ => ".".to_owned(),
            })
            .collect()
    };
    let each: Vec<String> = identities
        .iter()
        .map(|i| match i.split_once('@') {
            Some(_) => format!("(^|[<\\s\"]){}", escape(i)),
            None => format!("@{}", escape(i)),
        })
        .collect();
    Some(format!("({})[>\\s]*$", each.join("|")))
}

/// `GET /v1/tasks` for a tenant: the `from` of `email.send` and of a campaign's message must be
/// at one of its identities.
pub fn with_identities(task: &str, schema: &mut Value, identities: &[String]) {
    let Some(pattern) = identities_pattern(identities) else { return };
    let from = match task {
        "email.send" => schema.pointer_mut("/properties/from"),
        "email.campaign" => schema.pointer_mut("/$defs/SendParams/properties/from"),
        _ => None,
    };
    if let Some(from) = from {
        from["pattern"] = json!(pattern);
        from["description"] = json!(format!(
            "{} This tenant's sending identities: {}.",
            from["description"].as_str().unwrap_or_default(),
            identities.join(", ")
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `store::send_reads` decides as `allowed`, on the bare address.
    fn allowed(identities: &[String], from: &str) -> bool {
        let Some(bare) = super::super::content::bare(from) else { return false };
        let domain = bare.rsplit_once('@').map_or("", |(_, d)| d);
        identities.iter().any(|i| *i == bare || *i == domain)
    }

    #[test]
    fn the_identities_pattern_takes_every_sender_the_send_takes_and_refuses_others() {
        let ids: Vec<String> = ["acme.example", "noreply@globex.example", "x-1.co"].map(String::from).into();
        let re = regex::Regex::new(&identities_pattern(&ids).unwrap()).unwrap();
        for from in [
            "a@acme.example",
            "A.B@ACME.example",
            "Acme <sales@acme.example>",
            "\"Acme, Inc\" <x@Acme.Example>",
            "noreply@globex.example",
            "Globex <NoReply@globex.example>",
            "z@x-1.co",
        ] {
            assert!(allowed(&ids, from), "{from}");
            assert!(re.is_match(from), "the client would refuse {from:?}, which the send takes");
        }
        for from in ["a@evil.example", "a@sub.acme.example", "other@globex.example", "a@acme.example.evil", "x-1.co"] {
            assert!(!allowed(&ids, from), "{from}");
            assert!(!re.is_match(from), "{from}");
        }
        assert_eq!(identities_pattern(&[]), None);
    }
}
