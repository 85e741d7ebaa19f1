//! How the OpenAPI document narrows the email tasks' published schemas (`Task::document_rules`):
//! sufficient rules, so that every request the document allows is one the send's checks
//! (`SendParams::check`, `CampaignParams::check`, `mime::check`) take. The published schema
//! (`super::rules`) keeps the necessary ones, what a client refuses by.
//!
//! An address is documented by `ADDRESS`, a shape the address parser always takes, and not by
//! `format: email`: the parser also takes a display name (`Acme <noreply@acme.example>`) and
//! forms format checkers differ on (a one-letter top-level label, which RFC 5321's domain
//! syntax allows), so a document saying `format: email` would call values the server takes
//! invalid.

use serde_json::{Value, json};

use super::campaign::{MAX_INLINE, MAX_PAGE};
use super::content::{
    MAX_HEADER_VALUE, MAX_RECIPIENTS, RESERVED_HEADER_PREFIXES, RESERVED_HEADERS, RESERVED_TAG_PREFIX, TAG_PATTERN,
};
use super::mime;
use crate::pattern::{ONE_LINE, PRINTABLE, any_case};
use crate::store::templates::NAME_PATTERN as TEMPLATE_NAME;

/// A bare email address of the common shape (dot-atom local part, host name): one the address
/// parser always takes.
pub const ADDRESS: &str = "^[A-Za-z0-9_+-]{1,32}(\\.[A-Za-z0-9_+-]{1,31})?@[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?){0,2}$";

/// The most recipients a page of a campaign's recipients holds, and the fewest.
pub fn recipient_page(page: &mut Value) {
    page["properties"]["recipients"]["minItems"] = json!(1);
    page["properties"]["recipients"]["maxItems"] = json!(MAX_PAGE);
}

/// A recipient (`email.campaign`'s inline ones, a page's): its address of the common shape.
pub fn recipient(r: &mut Value) {
    address(&mut r["properties"]["to"]);
}

/// `email.send`'s params: `message`'s rules, its extra parts and attachments.
pub fn send(schema: &mut Value) {
    message(schema, false);
    parts_and_attachments(schema);
}

/// `email.campaign`'s: inline recipients or pages, not both; recipients' `data` only with a
/// stored template (a literal message takes none); the message's rules with no recipient and
/// no extra part or attachment.
pub fn campaign(schema: &mut Value) {
    schema["oneOf"] = json!([
        {"required": ["recipients"], "properties": {"pages": {"type": "null"},
            "recipients": {"minItems": 1, "maxItems": MAX_INLINE}}},
        {"required": ["pages"], "properties": {"pages": {"type": "integer"}, "recipients": {"maxItems": 0}}},
    ]);
    schema["anyOf"] = json!([
        {"properties": {"message": {"required": ["template"], "properties": {"template": {"type": "string"}}}}},
        {"properties": {"recipients": {"items": {"properties": {"data": {"maxProperties": 0}}}}}},
    ]);
    if let Some(m) = schema.pointer_mut("/$defs/SendParams") {
        message(m, true);
    }
    if let Some(r) = schema.pointer_mut("/$defs/Recipient") {
        recipient(r);
    }
    parts_and_attachments(schema);
}

/// An address field: `ADDRESS`, without `format: email` (see the module).
fn address(field: &mut Value) {
    field["pattern"] = json!(ADDRESS);
    if let Some(f) = field.as_object_mut() {
        f.remove("format");
    }
}

/// A message (`email.send`'s params, or a campaign's message, which names no recipient):
/// addresses of the common shape, 1 to 50 recipients, a stored template or a one-line subject
/// with text or html, header names no one else sets, SES tag text (`SendParams::check`).
fn message(p: &mut Value, campaign: bool) {
    let props = &mut p["properties"];
    address(&mut props["from"]);
    props["from"]["description"] = json!(
        "One of the tenant's sending identities. The pattern states the common address shape; \
        the server also takes a display name (`Acme <noreply@acme.example>`) and other RFC 5322 forms."
    );
    let one = json!({"type": "string", "pattern": ADDRESS});
    for list in ["to", "cc", "bcc"] {
        props[list] = if campaign {
            json!({"type": "array", "maxItems": 0})
        } else {
            json!({"type": "array", "items": one, "maxItems": MAX_RECIPIENTS})
        };
    }
    if campaign {
        props["message_key"] = json!({"type": "null"});
    } else {
        props["message_key"]["pattern"] = json!(PRINTABLE);
    }
    props["reply_to"]["items"] = one;
    props["headers"]["propertyNames"] = header_name();
    props["headers"]["additionalProperties"] =
        json!({"type": "string", "pattern": format!("^[^\\x00\\r\\n]{{0,{MAX_HEADER_VALUE}}}$")});
    props["tags"]["propertyNames"] =
        json!({"type": "string", "pattern": TAG_PATTERN, "not": {"pattern": format!("^{RESERVED_TAG_PREFIX}")}});
    props["tags"]["additionalProperties"] = json!({"type": "string", "pattern": TAG_PATTERN});
    props["configuration_set"]["pattern"] = json!(TAG_PATTERN);
    let (parts, attachments) = if campaign { (0, 0) } else { (mime::MAX_PARTS, mime::MAX_ATTACHMENTS) };
    props["parts"]["maxItems"] = json!(parts);
    props["attachments"]["maxItems"] = json!(attachments);
    if !campaign {
        let one = |list: &str| json!({"required": [list], "properties": {list: {"minItems": 1}}});
        p["anyOf"] = json!([one("to"), one("cc"), one("bcc")]);
    }
    p["oneOf"] = json!([
        {"required": ["template"], "properties": {"template": {"type": "string", "pattern": TEMPLATE_NAME},
            "subject": {"type": "null"}, "text": {"type": "null"}, "html": {"type": "null"}}},
        {"required": ["subject"], "properties": {"template": {"type": "null"}, "subject": {"type": "string", "pattern": ONE_LINE},
            "data": {"maxProperties": 0}},
         "anyOf": [{"required": ["text"], "properties": {"text": {"type": "string"}}},
                   {"required": ["html"], "properties": {"html": {"type": "string"}}}]},
    ]);
}

/// A header name a client may set: visible ASCII but `:`, none of `RESERVED_HEADERS` nor
/// starting with one of `RESERVED_HEADER_PREFIXES` (in any case): `content::reserved_header`.
fn header_name() -> Value {
    let reserved = RESERVED_HEADERS.map(any_case).join("|");
    let prefixes = RESERVED_HEADER_PREFIXES.map(any_case).join("|");
    json!({"type": "string", "pattern": "^[!-9;-~]{1,126}$",
        "not": {"pattern": format!("^(({reserved})$|{prefixes})")}})
}

/// The rules of the `Part` and `Attachment` a task's schema holds under `$defs`.
fn parts_and_attachments(schema: &mut Value) {
    if let Some(part) = schema.pointer_mut("/$defs/Part") {
        part_rules(part);
    }
    if let Some(attachment) = schema.pointer_mut("/$defs/Attachment") {
        attachment_rules(attachment);
    }
}

/// An RFC 2045 token.
const TOKEN: &str = "[!#$%&'*+.^_`|~0-9A-Za-z-]+";

/// A media type's type and subtype (RFC 2045 tokens), then `; name=value` parameters.
fn media_type_pattern(essence: &str) -> String {
    format!("^{essence}( *; *{TOKEN}=({TOKEN}|\"[^\"\\\\\\x00-\\x1f]*\"))*$")
}

/// An extra part (`mime::part_type`): text other than plain and HTML; a calendar names its
/// iTIP method (RFC 5546), its `METHOD` line the same (checked by the server).
fn part_rules(s: &mut Value) {
    let methods = mime::CALENDAR_METHODS.join("|");
    let calendar = format!("^{}/{}( |;|$)", any_case("text"), any_case("calendar"));
    let plain_or_html = format!("^{}/({}|{})( |;|$)", any_case("text"), any_case("plain"), any_case("html"));
    let ct = &mut s["properties"]["content_type"];
    ct["maxLength"] = json!(255);
    ct["pattern"] = json!(media_type_pattern(&format!("{}/{TOKEN}", any_case("text"))));
    ct["not"] = json!({"pattern": plain_or_html});
    let method = format!("; *{}=\"?({methods})\"?( |;|$)", any_case("method"));
    ct["anyOf"] = json!([{"not": {"pattern": calendar}}, {"pattern": method}]);
    s["properties"]["content"]["minLength"] = json!(1);
}

/// An attachment (`mime::check`): a file's media type, a name SES sends, padded base64.
fn attachment_rules(s: &mut Value) {
    let p = &mut s["properties"];
    let refused = mime::UNSUPPORTED_EXTENSIONS.map(any_case).join("|");
    p["filename"]["pattern"] = json!(format!("^[^\\x00-\\x1f\\x7f-\\x9f/\\\\]{{1,{}}}$", mime::MAX_FILENAME));
    p["filename"]["not"] = json!({"pattern": format!("\\.({refused})[. ]*$")});
    p["content_type"]["pattern"] = json!(media_type_pattern(&format!("{TOKEN}/{TOKEN}")));
    p["content_type"]["maxLength"] = json!(255);
    p["content_type"]["not"] = json!({"pattern": format!("^({}|{})/", any_case("multipart"), any_case("message"))});
    p["content_base64"]["pattern"] = json!("^([A-Za-z0-9+/]{4})*([A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$");
    p["content_base64"]["maxLength"] = json!(mime::MAX_CONTENT_BYTES.div_ceil(3) * 4);
    p["content_id"]["pattern"] = json!(format!("^[!#$%&'*+./0-9=?@A-Z^_`a-z{{|}}~-]{{1,{}}}$", mime::MAX_CONTENT_ID));
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every address `ADDRESS` allows, the send's address parser takes: a one-letter top-level
    /// label (`yMSZJEjY3@1F--VVo-j.I`, which a format checker refused in the fuzz run) among
    /// them; and `from` is not documented as `format: email`, which refuses a display name.
    #[test]
    fn documented_addresses_are_ones_the_server_takes() {
        let re = regex::Regex::new(ADDRESS).unwrap();
        for a in ["yMSZJEjY3@1F--VVo-j.I", "a@b", "a.b+c@x-1.example.co", "_@9.z"] {
            assert!(re.is_match(a), "{a}");
            assert!(super::super::content::bare(a).is_some(), "the server refuses {a:?}");
        }
        assert!(super::super::content::bare("Acme <noreply@acme.example>").is_some());
        let mut schema = json!({"properties": {"from": {"type": "string", "format": "email"}}});
        message(&mut schema, false);
        assert_eq!(schema["properties"]["from"]["pattern"], ADDRESS);
        assert_eq!(schema["properties"]["from"].get("format"), None);
    }
}
