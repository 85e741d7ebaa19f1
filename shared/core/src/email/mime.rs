//! The MIME message every `email.send` goes out as (SES v2 `SendEmail`, raw content), built by
//! `mail-builder`: `text`, `html` and the client's extra inline alternatives (`parts`, e.g. an
//! iTIP invitation, `text/calendar; method=REQUEST`) in one `multipart/alternative`; inline
//! attachments beside it in `multipart/related`; the other attachments after it in
//! `multipart/mixed`. And what is checked at submit of the parts and attachments a client gives:
//! media types, calendar methods, file names, base64, sizes.

use std::collections::BTreeSet;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use mail_builder::MessageBuilder;
use mail_builder::headers::address::Address;
use mail_builder::headers::content_type::ContentType;
use mail_builder::headers::raw::Raw;
use mail_builder::headers::text::Text;
use mail_builder::mime::{BodyPart, MimePart};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::media_type::{MediaType, MediaTypeError, media_type};
use crate::plain::NameValue;
use crate::plain::ParamError;

/// Most extra parts, and most attachments, per message.
pub const MAX_PARTS: usize = 10;
pub const MAX_ATTACHMENTS: usize = 10;
/// Most bytes of parts and attachments together, decoded. In base64 (4/3 of this) they stay
/// well under a request's 1 MiB body limit (`api::MAX_BODY_BYTES`), which bounds a job's params.
pub const MAX_CONTENT_BYTES: usize = 512 * 1024;
/// SES's limit on a whole message, attachments included, after encoding.
pub const SES_MAX_MESSAGE_BYTES: usize = 40 * 1024 * 1024;
/// The iTIP methods (RFC 5546, 1.4) a `text/calendar` part may name.
pub const CALENDAR_METHODS: [&str; 8] =
    ["PUBLISH", "REQUEST", "REPLY", "ADD", "CANCEL", "REFRESH", "COUNTER", "DECLINECOUNTER"];
/// The longest file name (SES's `Attachment.FileName`) and content id (`Attachment.ContentId`).
pub const MAX_FILENAME: usize = 255;
pub const MAX_CONTENT_ID: usize = 78;
/// File extensions SES refuses to send ("Unsupported attachment types", SES developer guide).
pub const UNSUPPORTED_EXTENSIONS: [&str; 90] = [
    "ade", "adp", "app", "asp", "bas", "bat", "cer", "chm", "cmd", "com", "cpl", "crt", "csh", "der", "exe", "fxp",
    "gadget", "hlp", "hta", "inf", "ins", "isp", "its", "js", "jse", "ksh", "lib", "lnk", "mad", "maf", "mag", "mam",
    "maq", "mar", "mas", "mat", "mau", "mav", "maw", "mda", "mdb", "mde", "mdt", "mdw", "mdz", "msc", "msh", "msh1",
    "msh2", "mshxml", "msh1xml", "msh2xml", "msi", "msp", "mst", "ops", "pcd", "pif", "plg", "prf", "prg", "reg",
    "scf", "scr", "sct", "shb", "shs", "sys", "ps1", "ps1xml", "ps2", "ps2xml", "psc1", "psc2", "tmp", "url", "vb",
    "vbe", "vbs", "vps", "vsmacros", "vss", "vst", "vsw", "vxd", "ws", "wsc", "wsf", "wsh", "xnk",
];

/// An extra inline alternative to `text` and `html`, sent as given (never templated).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Part {
    /// A `text/*` media type other than `text/plain` and `text/html` (those are `text` and
    /// `html`), sent as UTF-8. `text/calendar` names its iTIP method (RFC 5546), which the
    /// calendar's own `METHOD` line must match: `text/calendar; method=REQUEST`.
    pub content_type: String,
    /// The part's text.
    pub content: String,
}

/// How a client shows an attachment: as a file (the default) or inside the HTML (`cid:`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Disposition {
    #[default]
    Attachment,
    Inline,
}

/// A file sent with the message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Attachment {
    /// The name the recipient sees (no control characters, `/` or `\`; not an extension SES
    /// refuses, such as `.exe` or `.bat`).
    pub filename: String,
    /// Its media type, e.g. `application/pdf` (not `multipart/*` or `message/*`).
    pub content_type: String,
    /// Its bytes, base64 (standard alphabet, padded).
    pub content_base64: String,
    #[serde(default)]
    pub disposition: Disposition,
    /// What the HTML refers to it by (`<img src="cid:logo">`); required when inline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content_id: Option<String>,
}

/// A part's media type, checked: text other than plain and HTML, UTF-8, and a calendar names
/// an iTIP method (upper-cased).
pub fn part_type(p: &Part) -> Result<MediaType, MediaTypeError> {
    let mut mt = media_type(&p.content_type)?;
    if !mt.essence.starts_with("text/") || mt.essence == "text/plain" || mt.essence == "text/html" {
        return Err(MediaTypeError::NotExtraText);
    }
    if mt.param("charset").is_some_and(|c| !c.eq_ignore_ascii_case("utf-8")) {
        return Err(MediaTypeError::Charset);
    }
    if mt.essence == "text/calendar" {
        let methods = CALENDAR_METHODS.join(", ");
        let Some(method) = mt.param("method").map(str::to_ascii_uppercase) else {
            return Err(MediaTypeError::NoMethod(methods));
        };
        if !CALENDAR_METHODS.contains(&method.as_str()) {
            return Err(MediaTypeError::Method { method, methods });
        }
        for (n, v) in mt.params.iter_mut() {
            if n == "method" {
                *v = method.clone();
            }
        }
    }
    Ok(mt)
}

/// The `METHOD` property of an iCalendar object, if it has one at the top level.
fn calendar_method(ics: &str) -> Option<String> {
    ics.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim().eq_ignore_ascii_case("METHOD").then(|| value.trim().to_ascii_uppercase())
    })
}

/// The checks at submit of `parts` and `attachments`, as (field, message).
pub fn check(parts: &[Part], attachments: &[Attachment]) -> Result<(), ParamError> {
    if parts.len() > MAX_PARTS {
        return Err(ParamError::new("parts", format!("{} parts; at most {MAX_PARTS}", parts.len())));
    }
    if attachments.len() > MAX_ATTACHMENTS {
        return Err(ParamError::new(
            "attachments",
            format!("{} attachments; at most {MAX_ATTACHMENTS}", attachments.len()),
        ));
    }
    let too_big = |field: String| {
        ParamError::new(field, format!("parts and attachments come to more than {MAX_CONTENT_BYTES} bytes"))
    };
    let mut total = 0usize;
    let mut types = BTreeSet::new();
    for (i, p) in parts.iter().enumerate() {
        let mt = part_type(p).map_err(|e| ParamError::new(format!("parts[{i}].content_type"), e.to_string()))?;
        if !types.insert(mt.essence.clone()) {
            return Err(ParamError::new(format!("parts[{i}].content_type"), format!("a second {} part", mt.essence)));
        }
        let field = format!("parts[{i}].content");
        if p.content.trim().is_empty() {
            return Err(ParamError::new(field, "empty"));
        }
        if let Some(method) = mt.param("method") {
            if !p.content.contains("BEGIN:VCALENDAR") {
                return Err(ParamError::new(field, "not an iCalendar object (BEGIN:VCALENDAR)"));
            }
            match calendar_method(&p.content) {
                Some(m) if m == method => {}
                Some(m) => {
                    return Err(ParamError::new(
                        field,
                        format!("METHOD:{m} differs from the content type's method={method}"),
                    ));
                }
                None => {
                    return Err(ParamError::new(field, format!("an iTIP message has a METHOD line (METHOD:{method})")));
                }
            }
        }
        total += p.content.len();
        if total > MAX_CONTENT_BYTES {
            return Err(too_big(field));
        }
    }
    let mut ids = BTreeSet::new();
    for (i, a) in attachments.iter().enumerate() {
        let at = |f: &str| format!("attachments[{i}].{f}");
        check_filename(&a.filename).map_err(|e| ParamError::new(at("filename"), e.to_string()))?;
        let mt = media_type(&a.content_type).map_err(|e| ParamError::new(at("content_type"), e.to_string()))?;
        if mt.essence.starts_with("multipart/") || mt.essence.starts_with("message/") {
            return Err(ParamError::new(at("content_type"), "a file's type, not multipart/* or message/*"));
        }
        match &a.content_id {
            Some(id) => {
                let ok = (1..=MAX_CONTENT_ID).contains(&id.len())
                    && id.chars().all(|c| c.is_ascii_graphic() && !"<>()[]\\\",;:".contains(c));
                if !ok {
                    return Err(ParamError::new(
                        at("content_id"),
                        format!("1 to {MAX_CONTENT_ID} visible ASCII characters, no <>()[]\\\",;:"),
                    ));
                }
                if !ids.insert(id.clone()) {
                    return Err(ParamError::new(at("content_id"), "given to two attachments"));
                }
            }
            None if a.disposition == Disposition::Inline => {
                return Err(ParamError::new(
                    at("content_id"),
                    "an inline attachment needs a content_id for the HTML to name",
                ));
            }
            None => {}
        }
        // Bounded before decoding: base64 is 4 characters per 3 bytes, less its padding.
        if base64_len(&a.content_base64) > MAX_CONTENT_BYTES {
            return Err(too_big(at("content_base64")));
        }
        let bytes = STANDARD.decode(&a.content_base64).map_err(|e| {
            ParamError::new(at("content_base64"), format!("not base64 (standard alphabet, padded): {e}"))
        })?;
        total += bytes.len();
        if total > MAX_CONTENT_BYTES {
            return Err(too_big(at("content_base64")));
        }
    }
    Ok(())
}

/// An attachment's size in bytes, decoded (0 when it is not base64, which `check` refused).
pub fn decoded_size(b64: &str) -> usize {
    STANDARD.decode(b64).map_or(0, |b| b.len())
}

/// How many bytes padded base64 of this text decodes to, without decoding it.
fn base64_len(b64: &str) -> usize {
    let padding = b64.bytes().rev().take_while(|b| *b == b'=').count().min(2);
    (b64.len() / 4 * 3).saturating_sub(padding)
}

/// Why an attachment's file name is refused, in the words the API answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FilenameError {
    #[error("1 to {} characters", MAX_FILENAME)]
    Length,
    #[error("no control characters (CR, LF, NUL…), '/' or '\\'")]
    Characters,
    #[error("SES refuses .{0} attachments")]
    Extension(String),
    #[error(transparent)]
    Encoded(#[from] super::encoded_words::WordError),
    /// The name a mail client shows (its RFC 2047 words decoded) is refused.
    #[error("decoded as RFC 2047 ({shown:?}): {why}")]
    Decoded { shown: String, why: Box<FilenameError> },
}

/// A file name as given, then as a mail client shows it (`encoded_words::decode`): both must pass.
fn check_filename(name: &str) -> Result<(), FilenameError> {
    check_shown_name(name)?;
    if name.contains("=?") {
        let shown = super::encoded_words::decode(name)?;
        check_shown_name(&shown).map_err(|why| FilenameError::Decoded { shown, why: Box::new(why) })?;
    }
    Ok(())
}

fn check_shown_name(name: &str) -> Result<(), FilenameError> {
    let n = name.chars().count();
    if n == 0 || n > MAX_FILENAME || name.trim().is_empty() {
        return Err(FilenameError::Length);
    }
    if name.chars().any(|c| c.is_control() || c == '/' || c == '\\') {
        return Err(FilenameError::Characters);
    }
    if let Some((_, ext)) = name.trim_end_matches([' ', '.']).rsplit_once('.')
        && UNSUPPORTED_EXTENSIONS.contains(&ext.to_ascii_lowercase().as_str())
    {
        return Err(FilenameError::Extension(ext.to_ascii_lowercase()));
    }
    Ok(())
}

/// What a message looks like from outside: its addressing and content, rendered.
pub struct Envelope<'a> {
    pub from: &'a str,
    pub to: &'a [String],
    pub cc: &'a [String],
    pub reply_to: &'a [String],
    pub subject: &'a str,
    pub text: Option<&'a str>,
    pub html: Option<&'a str>,
    /// Every header beside the addressing ones, in order.
    pub headers: &'a [NameValue],
    pub parts: &'a [Part],
    pub attachments: &'a [Attachment],
    /// The `Message-ID` (SES replaces it with its own; this makes the bytes reproducible).
    pub message_id: &'a str,
}

fn address(a: &str) -> Address<'static> {
    match a.parse::<email_address::EmailAddress>() {
        Ok(e) => {
            let name = e.display_part().trim().trim_matches('"').trim().to_owned();
            Address::new_address((!name.is_empty()).then_some(name), e.email().to_owned())
        }
        Err(_) => Address::new_address(None::<String>, a.to_owned()),
    }
}

fn addresses(list: &[String]) -> Address<'static> {
    Address::new_list(list.iter().map(|a| address(a)).collect())
}

/// Base64 in lines of 76 characters (RFC 2045 6.8): a file leaves 7-bit whatever its type.
fn base64_lines(bytes: &[u8]) -> String {
    let text = STANDARD.encode(bytes);
    let mut out = String::with_capacity(text.len() + text.len() / 76 * 2 + 2);
    for line in text.as_bytes().chunks(76) {
        out.push_str(std::str::from_utf8(line).unwrap_or_default());
        out.push_str("\r\n");
    }
    out
}

/// Why a message could not be built: only what `check` refuses, or a message over SES's limit.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error(transparent)]
    MediaType(#[from] MediaTypeError),
    #[error("a message needs text, html or a part")]
    Empty,
    #[error("{file}: {error}")]
    Base64 { file: String, error: base64::DecodeError },
    #[error("{0}")]
    Write(#[from] std::io::Error),
    #[error("the message is {0} bytes; SES takes at most {most}", most = SES_MAX_MESSAGE_BYTES)]
    TooBig(usize),
}

/// Build the message. Fails only on what `check` refuses, or a message over SES's limit.
pub fn build(e: &Envelope<'_>) -> Result<Vec<u8>, BuildError> {
    let mut alternatives = Vec::new();
    if let Some(text) = e.text {
        alternatives.push(MimePart::new("text/plain", text.to_owned()));
    }
    if let Some(html) = e.html {
        alternatives.push(MimePart::new("text/html", html.to_owned()));
    }
    for p in e.parts {
        alternatives.push(MimePart::new(part_type(p)?.header(true), p.content.clone()));
    }
    let mut body = match alternatives.len() {
        0 => return Err(BuildError::Empty),
        1 => alternatives.remove(0),
        _ => MimePart::new("multipart/alternative", alternatives),
    };
    let (mut inline, mut attached) = (Vec::new(), Vec::new());
    for a in e.attachments {
        let bytes = STANDARD
            .decode(&a.content_base64)
            .map_err(|error| BuildError::Base64 { file: a.filename.clone(), error })?;
        let disposition = match a.disposition {
            Disposition::Attachment => "attachment",
            Disposition::Inline => "inline",
        };
        let mut part = MimePart::new(
            media_type(&a.content_type)?.header(false),
            BodyPart::Binary(base64_lines(&bytes).into_bytes().into()),
        )
        .header("Content-Disposition", ContentType::new(disposition).attribute("filename", a.filename.clone()))
        .transfer_encoding("base64");
        if let Some(id) = &a.content_id {
            part = part.cid(id.clone());
        }
        match a.disposition {
            Disposition::Inline => inline.push(part),
            Disposition::Attachment => attached.push(part),
        }
    }
    if !inline.is_empty() {
        body = MimePart::new("multipart/related", std::iter::once(body).chain(inline).collect::<Vec<_>>());
    }
    if !attached.is_empty() {
        body = MimePart::new("multipart/mixed", std::iter::once(body).chain(attached).collect::<Vec<_>>());
    }
    let mut m = MessageBuilder::new().from(address(e.from)).subject(Text::new(e.subject.to_owned()));
    if !e.to.is_empty() {
        m = m.to(addresses(e.to));
    }
    if !e.cc.is_empty() {
        m = m.cc(addresses(e.cc));
    }
    if !e.reply_to.is_empty() {
        m = m.reply_to(addresses(e.reply_to));
    }
    m = m.message_id(e.message_id.to_owned());
    for (name, value) in e.headers {
        // ASCII as given (List-Unsubscribe must not be encoded); anything else RFC 2047-encoded.
        m = if value.is_ascii() {
            m.header(name.clone(), Raw::new(value.clone()))
        } else {
            m.header(name.clone(), Text::new(value.clone()))
        };
    }
    let raw = m.body(body).write_to_vec()?;
    if raw.len() > SES_MAX_MESSAGE_BYTES {
        return Err(BuildError::TooBig(raw.len()));
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ICS: &str = "BEGIN:VCALENDAR\r\nMETHOD:REQUEST\r\nBEGIN:VEVENT\r\nEND:VEVENT\r\nEND:VCALENDAR\r\n";

    fn part(ct: &str, content: &str) -> Part {
        Part { content_type: ct.into(), content: content.into() }
    }

    fn file(name: &str, ct: &str, b64: &str) -> Attachment {
        Attachment {
            filename: name.into(),
            content_type: ct.into(),
            content_base64: b64.into(),
            disposition: Disposition::Attachment,
            content_id: None,
        }
    }

    #[test]
    fn media_types_parse_with_their_parameters() {
        let mt = media_type("Text/Calendar; Method=request;charset=\"utf-8\"").unwrap();
        assert_eq!(mt.essence, "text/calendar");
        assert_eq!(
            mt.params,
            [("method".to_owned(), "request".to_owned()), ("charset".to_owned(), "utf-8".to_owned())]
        );
        for bad in
            ["pdf", "a/", "/b", "a/b; x", "a/b; x=", "a/b; x=\"open", "a/b; x=1; x=2", "a/b c", "a/b;\r\nx=1", "é/b"]
        {
            assert!(media_type(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn a_calendar_part_names_an_itip_method_its_content_agrees_with() {
        assert_eq!(check(&[part("text/calendar; method=request", ICS)], &[]), Ok(()));
        assert_eq!(
            part_type(&part("text/calendar; method=request", ICS)).unwrap().to_text(),
            "text/calendar; method=REQUEST"
        );
        let field = |p: Part| check(&[p], &[]).unwrap_err().field;
        assert_eq!(field(part("text/calendar", ICS)), "parts[0].content_type");
        assert_eq!(field(part("text/calendar; method=INVITE", ICS)), "parts[0].content_type");
        assert_eq!(field(part("text/calendar; method=CANCEL", ICS)), "parts[0].content");
        assert_eq!(
            field(part("text/calendar; method=REQUEST", "BEGIN:VCALENDAR\r\nEND:VCALENDAR")),
            "parts[0].content"
        );
        assert_eq!(field(part("text/plain", "x")), "parts[0].content_type");
        assert_eq!(field(part("application/json", "{}")), "parts[0].content_type");
        assert_eq!(field(part("text/x-note; charset=latin1", "x")), "parts[0].content_type");
        let many: Vec<Part> = (0..=MAX_PARTS).map(|i| part(&format!("text/x-{i}"), "x")).collect();
        assert_eq!(check(&many, &[]).unwrap_err().field, "parts");
    }

    #[test]
    fn attachments_are_named_typed_and_bounded() {
        assert_eq!(check(&[], &[file("Jahresabschluß 2024.pdf", "application/pdf", "JVBERg==")]), Ok(()));
        let field = |a: Attachment| check(&[], &[a]).unwrap_err().field;
        assert_eq!(field(file("a\r\nb.pdf", "application/pdf", "eA==")), "attachments[0].filename");
        assert_eq!(field(file("../etc/passwd", "text/plain", "eA==")), "attachments[0].filename");
        assert_eq!(field(file("setup.Exe", "application/pdf", "eA==")), "attachments[0].filename");
        assert_eq!(field(file("setup.exe.", "application/pdf", "eA==")), "attachments[0].filename");
        assert_eq!(field(file("a.pdf", "multipart/mixed", "eA==")), "attachments[0].content_type");
        assert_eq!(field(file("a.pdf", "application/pdf", "eA")), "attachments[0].content_base64");
        let big = STANDARD.encode(vec![0u8; MAX_CONTENT_BYTES + 1]);
        assert_eq!(field(file("a.pdf", "application/pdf", &big)), "attachments[0].content_base64");
        let half = STANDARD.encode(vec![0u8; MAX_CONTENT_BYTES / 2 + 1]);
        let two = [file("a.pdf", "application/pdf", &half), file("b.pdf", "application/pdf", &half)];
        assert_eq!(check(&[], &two).unwrap_err().field, "attachments[1].content_base64", "the total is bounded too");
        let inline = Attachment { disposition: Disposition::Inline, ..file("logo.png", "image/png", "eA==") };
        assert_eq!(field(inline.clone()), "attachments[0].content_id");
        let named = Attachment { content_id: Some("logo@acme".into()), ..inline };
        assert_eq!(check(&[], &[named.clone(), named]).unwrap_err().field, "attachments[1].content_id");
    }

    #[test]
    fn sizes_are_read_from_base64_exactly_and_encoded_names_checked_as_a_client_shows_them() {
        for n in [0, 1, 2, 3, 4, MAX_CONTENT_BYTES - 1, MAX_CONTENT_BYTES, MAX_CONTENT_BYTES + 1] {
            assert_eq!(base64_len(&STANDARD.encode(vec![1u8; n])), n);
        }
        assert!(check_filename("=?utf-8?b?YS5leGU=?=").unwrap_err().to_string().contains(".exe"));
        assert!(check_filename("=?utf-8?q?Z=C3=BCrich.pdf?=").is_ok());
    }

    #[test]
    fn the_message_nests_alternatives_related_and_mixed() {
        let parts = [part("text/calendar; method=REQUEST", ICS)];
        let logo = Attachment {
            disposition: Disposition::Inline,
            content_id: Some("logo@acme".into()),
            ..file("logo.png", "image/png", "iVBORw0KGgo=")
        };
        let files = [file("agenda.pdf", "application/pdf", "JVBERg=="), logo];
        let headers = [("List-Unsubscribe".to_owned(), "<https://acme.example/u/1>".to_owned())];
        let to = ["Bo <bo@example.com>".to_owned()];
        let e = Envelope {
            from: "Acme <noreply@acme.example>",
            to: &to,
            cc: &[],
            reply_to: &[],
            subject: "Invitation",
            text: Some("hi"),
            html: Some("<p>hi</p>"),
            headers: &headers,
            parts: &parts,
            attachments: &files,
            message_id: "m1@acme.example",
        };
        let raw = String::from_utf8(build(&e).unwrap()).unwrap();
        let at = |needle: &str| raw.find(needle).unwrap_or_else(|| panic!("{needle:?} in {raw}"));
        assert!(at("multipart/mixed") < at("multipart/related"));
        assert!(at("multipart/related") < at("multipart/alternative"));
        assert!(at("text/plain") < at("text/html") && at("text/html") < at("text/calendar; method=\"REQUEST\""));
        assert!(at("text/calendar") < at("image/png") && at("image/png") < at("application/pdf"));
        assert!(raw.contains("List-Unsubscribe: <https://acme.example/u/1>\r\n"), "{raw}");
        assert!(raw.contains("Message-ID: <m1@acme.example>\r\n"));
        assert!(raw.contains("Content-ID: <logo@acme>"));
        assert!(raw.is_ascii(), "7-bit on the wire");
        let plain = Envelope { parts: &[], attachments: &[], html: None, ..e };
        let raw = String::from_utf8(build(&plain).unwrap()).unwrap();
        assert!(!raw.contains("multipart"), "a plain message is one part: {raw}");
    }
}
