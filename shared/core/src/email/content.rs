//! What an `email.send` job asks for, checked at submit (everything that needs no database),
//! and the rendering of its content: an inline template (the message's own subject and
//! bodies) or a stored one, rendered with `data` by minijinja in strict mode (a missing
//! variable is an error; HTML escaped in `html` only, and only the characters HTML needs).

use std::collections::BTreeMap;

use email_address::EmailAddress;
use minijinja::{Environment, UndefinedBehavior};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::mime::{self, Attachment, Part};
use crate::plain::NameValue;
use crate::plain::ParamError;
use crate::store::templates::Template;

/// SES accepts at most 50 recipients per message (to, cc and bcc together).
pub const MAX_RECIPIENTS: usize = 50;
/// Tags Relay sets itself; a client may not set them.
pub const RESERVED_TAG_PREFIX: &str = "relay_";
/// Headers SES or Relay set; a client may not set them through `headers`: the addressing,
/// and the MIME structure Relay builds (`email::mime`), and SES's signature.
pub const RESERVED_HEADERS: [&str; 13] = [
    "from",
    "to",
    "cc",
    "bcc",
    "subject",
    "reply-to",
    "date",
    "message-id",
    "return-path",
    "sender",
    "mime-version",
    "dkim-signature",
    "feedback-id",
];
/// Families of headers a client may not set: `Content-*` (RFC 2045's MIME headers: the
/// message's type, encoding, disposition, which Relay writes), `X-SES-*` (read by SES from a
/// raw message: configuration set, tags, sending authorization) and Relay's own `X-Relay-*`.
pub const RESERVED_HEADER_PREFIXES: [&str; 3] = ["content-", "x-ses-", "x-relay-"];
/// Whether a header of this name is Relay's or SES's to set (`RESERVED_HEADERS`, any case,
/// and `RESERVED_HEADER_PREFIXES`).
pub fn reserved_header(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    RESERVED_HEADERS.contains(&name.as_str()) || RESERVED_HEADER_PREFIXES.iter().any(|p| name.starts_with(p))
}

/// The header that carries the correlation id verbatim (tags allow only a narrow charset).
pub const CORRELATION_HEADER: &str = "X-Relay-Correlation-Id";

#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SendParams {
    /// The sender: one of the tenant's sending identities (an address, or any address at an
    /// identity domain), optionally with a display name (`Acme <noreply@acme.example>`).
    pub from: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub to: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub cc: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bcc: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reply_to: Vec<String>,
    /// The subject, an inline template rendered with `data` (not with `template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subject: Option<String>,
    /// The plain-text body, an inline template rendered with `data` (not with `template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The HTML body, an inline template rendered with `data`, auto-escaped (not with `template`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// A stored template's name (`PUT /v1/templates/{name}`), rendered with `data`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<String>,
    /// Variables for the inline or stored template and `list_unsubscribe`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub data: BTreeMap<String, Value>,
    /// Extra message headers (not the addressing ones).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// SES message tags (letters, digits, `_` and `-`; names not starting `relay_`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
    /// The SES configuration set to send with (event publishing to the ingress topic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub configuration_set: Option<String>,
    /// The tenant's subscription topic this message belongs to (1 to 64 letters, digits, `_`,
    /// `-` or `.`): skipped for an address opted out of it (`/v1/topic-opt-outs`). None:
    /// transactional mail, which topic opt-outs do not touch (the suppression list blocks both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 64, pattern = "^[A-Za-z0-9_.-]{1,64}$")]
    pub topic: Option<String>,
    /// At most one email is ever sent per tenant and message key; default: the job id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message_key: Option<String>,
    /// `List-Unsubscribe` (and RFC 8058's `List-Unsubscribe-Post`) built for this message from
    /// templates rendered with `data` (in a campaign, each recipient's own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub list_unsubscribe: Option<ListUnsubscribe>,
    /// Extra inline alternatives beside `text` and `html` (at most 10), e.g. an invitation:
    /// `{"content_type": "text/calendar; method=REQUEST", "content": "BEGIN:VCALENDAR…"}`.
    /// Literal, also with a template.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<Part>,
    /// Files sent with the message (at most 10; parts and attachments at most 512 KiB together,
    /// decoded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attachments: Vec<Attachment>,
}

/// The unsubscribe headers of RFC 2369 and RFC 8058, from minijinja templates (strict mode)
/// rendered with the message's `data`: `List-Unsubscribe: <https://…>, <mailto:…>` and, for
/// one-click, `List-Unsubscribe-Post: List-Unsubscribe=One-Click`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ListUnsubscribe {
    /// An `https://` URL template, e.g. `https://acme.example/unsubscribe/{{ token }}`; it must
    /// render to a valid URI (use minijinja's `urlencode` filter on free text).
    #[schema(min_length = 9, max_length = 2000, pattern = "^https://[^\\x00-\\x1f\\x7f-\\x9f]*$")]
    pub url: String,
    /// An address template the unsubscribe may also be mailed to (`mailto:`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(min_length = 1, max_length = 2000, pattern = "^[^\\x00-\\x1f\\x7f-\\x9f]*$")]
    pub mailto: Option<String>,
    /// Whether the URL takes RFC 8058's one-click POST (default true).
    #[serde(default = "one_click_default")]
    pub one_click: bool,
}

fn one_click_default() -> bool {
    true
}

/// The headers `list_unsubscribe` sets; a client may not set them through `headers` as well.
pub const UNSUBSCRIBE_HEADERS: [&str; 2] = ["List-Unsubscribe", "List-Unsubscribe-Post"];
/// The longest header value Relay sends (a line of 998 characters, less the name).
pub const MAX_HEADER_VALUE: usize = 870;

/// What is sent: rendered, ready for SES.
#[derive(Debug, Clone, PartialEq)]
pub struct Rendered {
    pub subject: String,
    pub text: Option<String>,
    pub html: Option<String>,
    /// Headers rendered for this message (`list_unsubscribe`), after the client's own.
    pub headers: Vec<NameValue>,
}

fn address(field: &str, value: &str) -> Result<EmailAddress, ParamError> {
    if value.chars().any(char::is_control) {
        return Err(ParamError::new(field, "control characters are not allowed"));
    }
    value.parse::<EmailAddress>().map_err(|e| ParamError::new(field, format!("{value:?} is not an email address: {e}")))
}

/// The bare address (no display name), lower-cased: what identities and suppressions match.
pub fn bare(value: &str) -> Option<String> {
    value.parse::<EmailAddress>().ok().map(|a| a.email().to_lowercase())
}

/// A sending identity: an address (`noreply@acme.example`) or a domain (`acme.example`).
pub fn valid_identity(identity: &str) -> bool {
    match identity.split_once('@') {
        Some(_) => bare(identity).is_some_and(|b| b == identity.to_lowercase()),
        None => EmailAddress::is_valid_domain(identity),
    }
}

/// SES tag names and values, configuration sets: what `tag_text_ok` takes, as a pattern.
pub const TAG_PATTERN: &str = "^[A-Za-z0-9_-]{1,256}$";

fn tag_text_ok(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A value made fit for an SES tag (letters, digits, `_`, `-`; at most 256).
pub fn tag_value(s: &str) -> String {
    let v: String = s.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).take(256).collect();
    if v.is_empty() { "_".into() } else { v }
}

impl SendParams {
    /// Every recipient, as given.
    pub fn recipients(&self) -> impl Iterator<Item = &String> {
        self.to.iter().chain(&self.cc).chain(&self.bcc)
    }

    /// The checks that need no database, as (field, message): the fields, then the inline
    /// content and the headers rendered with this message's own `data`.
    pub fn check(&self) -> Result<(), ParamError> {
        self.check_fields()?;
        if self.template.is_none() {
            self.render_inline().map_err(|e| match e {
                RenderError::Part { part, error, .. } => ParamError::new(part, error.to_string()),
                e => ParamError::new("subject", e.to_string()),
            })?;
        }
        self.rendered_headers().map(|_| ())
    }

    /// `check` without rendering the content and headers (a campaign's message, before each
    /// recipient's data is over it): their templates' syntax only.
    pub fn check_fields(&self) -> Result<(), ParamError> {
        address("from", &self.from)?;
        let n = self.to.len() + self.cc.len() + self.bcc.len();
        if n == 0 {
            return Err(ParamError::new("to", "at least one recipient (to, cc or bcc)"));
        }
        if n > MAX_RECIPIENTS {
            return Err(ParamError::new(
                "to",
                format!("{n} recipients; SES takes at most {MAX_RECIPIENTS} per message"),
            ));
        }
        for (field, list) in [("to", &self.to), ("cc", &self.cc), ("bcc", &self.bcc), ("reply_to", &self.reply_to)] {
            for (i, a) in list.iter().enumerate() {
                address(&format!("{field}[{i}]"), a)?;
            }
        }
        match &self.template {
            Some(name) => {
                if self.subject.is_some() || self.text.is_some() || self.html.is_some() {
                    return Err(ParamError::new("template", "give a template or literal subject/text/html, not both"));
                }
                crate::store::templates::check_name(name).map_err(|m| ParamError::new("template", m.to_string()))?;
            }
            None => {
                match &self.subject {
                    Some(s) if !s.trim().is_empty() && !s.contains(['\r', '\n']) => {}
                    _ => {
                        return Err(ParamError::new(
                            "subject",
                            "a one-line, non-empty subject is required without a template",
                        ));
                    }
                }
                if self.text.is_none() && self.html.is_none() {
                    return Err(ParamError::new("text", "give text, html or both (or a template)"));
                }
                compile_check(self.subject.as_deref().unwrap_or_default(), self.text.as_deref(), self.html.as_deref())?;
            }
        }
        for (name, value) in &self.headers {
            let ok = !name.is_empty() && name.len() <= 126 && name.bytes().all(|b| b.is_ascii_graphic() && b != b':');
            if !ok {
                return Err(ParamError::new(format!("headers.{name}"), "not a valid header name"));
            }
            if reserved_header(name) {
                return Err(ParamError::new(
                    format!("headers.{name}"),
                    "set by Relay or SES (addressing, the MIME structure, sending); use the matching parameter",
                ));
            }
            if value.contains(['\r', '\n']) || value.chars().count() > MAX_HEADER_VALUE {
                return Err(ParamError::new(
                    format!("headers.{name}"),
                    format!("one line of at most {MAX_HEADER_VALUE} characters"),
                ));
            }
            if self.list_unsubscribe.is_some() && UNSUBSCRIBE_HEADERS.iter().any(|h| h.eq_ignore_ascii_case(name)) {
                return Err(ParamError::new(format!("headers.{name}"), "set by list_unsubscribe; give it there only"));
            }
        }
        if let Some(l) = &self.list_unsubscribe {
            let env = environment();
            for (part, source) in [("url", Some(&l.url)), ("mailto", l.mailto.as_ref())] {
                let Some(src) = source else { continue };
                let field = format!("list_unsubscribe.{part}");
                if src.is_empty() || src.chars().count() > 2000 || src.chars().any(char::is_control) {
                    return Err(ParamError::new(field, "1 to 2000 characters, no control characters"));
                }
                env.template_from_str(src).map_err(|e| ParamError::new(field, e.to_string()))?;
            }
            if !l.url.starts_with("https://") {
                return Err(ParamError::new("list_unsubscribe.url", "an https:// URL (RFC 8058)"));
            }
        }
        for (name, value) in &self.tags {
            if !tag_text_ok(name) || !tag_text_ok(value) {
                return Err(ParamError::new(
                    format!("tags.{name}"),
                    "names and values are 1 to 256 letters, digits, '_' or '-'",
                ));
            }
            if name.starts_with(RESERVED_TAG_PREFIX) {
                return Err(ParamError::new(format!("tags.{name}"), "tags starting relay_ are set by Relay"));
            }
        }
        if let Some(c) = &self.configuration_set
            && !tag_text_ok(c)
        {
            return Err(ParamError::new("configuration_set", "1 to 64 letters, digits, '_' or '-'"));
        }
        if let Some(t) = &self.topic {
            crate::store::topics::check_name(t).map_err(|m| ParamError::new("topic", m))?;
        }
        if let Some(k) = &self.message_key
            && (k.is_empty() || k.chars().count() > 200 || k.chars().any(char::is_control))
        {
            return Err(ParamError::new("message_key", "1 to 200 characters, no control characters"));
        }
        mime::check(&self.parts, &self.attachments)
    }

    /// The content to send: the inline template or the stored one, rendered with `data`.
    pub fn render(&self, template: Option<&Template>) -> Result<Rendered, RenderError> {
        let headers = self
            .rendered_headers()
            .map_err(|ParamError { field, message: error }| RenderError::Header { field, error })?;
        let body = match (&self.template, template) {
            (None, _) => self.render_inline()?,
            (Some(name), None) => return Err(RenderError::NoTemplate(name.clone())),
            (Some(_), Some(t)) => {
                render_parts(&t.name, &t.subject, t.text_body.as_deref(), t.html_body.as_deref(), &self.data)?
            }
        };
        Ok(Rendered { headers, ..body })
    }

    /// The message's own subject and bodies rendered as an inline template.
    fn render_inline(&self) -> Result<Rendered, RenderError> {
        let subject = self.subject.as_deref().unwrap_or_default();
        render_parts(INLINE, subject, self.text.as_deref(), self.html.as_deref(), &self.data)
    }

    /// The headers rendered from `data` (`list_unsubscribe`), or the field that cannot be.
    pub fn rendered_headers(&self) -> Result<Vec<NameValue>, ParamError> {
        let Some(l) = &self.list_unsubscribe else { return Ok(vec![]) };
        let env = environment();
        let render = |part: &str, src: &str| -> Result<String, ParamError> {
            let field = format!("list_unsubscribe.{part}");
            let out = env
                .template_from_str(src)
                .and_then(|t| t.render(minijinja::value::Serde(&self.data)))
                .map_err(|e| ParamError::new(field.clone(), e.to_string()))?;
            if out.chars().any(char::is_control) {
                return Err(ParamError::new(field, "rendered with control characters (CR, LF, NUL...)"));
            }
            if !out.is_ascii() {
                return Err(ParamError::new(
                    field,
                    "rendered with non-ASCII characters (percent-encode them: `urlencode`)",
                ));
            }
            Ok(out)
        };
        let url = render("url", &l.url)?;
        let uri: hyper::Uri = url
            .parse()
            .map_err(|e| ParamError::new("list_unsubscribe.url", format!("rendered {url:?}, not a URI: {e}")))?;
        if uri.scheme_str() != Some("https") || uri.host().is_none_or(str::is_empty) {
            return Err(ParamError::new("list_unsubscribe.url", format!("rendered {url:?}, not an https:// URL")));
        }
        let mut value = format!("<{uri}>");
        if let Some(src) = &l.mailto {
            let to = render("mailto", src)?;
            let a = address("list_unsubscribe.mailto", &to)?;
            value.push_str(&format!(", <mailto:{}>", a.email()));
        }
        if value.chars().count() > MAX_HEADER_VALUE {
            return Err(ParamError::new(
                "list_unsubscribe.url",
                format!("List-Unsubscribe would be longer than {MAX_HEADER_VALUE} characters"),
            ));
        }
        let mut headers = vec![(UNSUBSCRIBE_HEADERS[0].to_owned(), value)];
        if l.one_click {
            headers.push((UNSUBSCRIBE_HEADERS[1].to_owned(), "List-Unsubscribe=One-Click".to_owned()));
        }
        Ok(headers)
    }
}

/// Why a message's content could not be rendered (the job fails for good).
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    #[error("template {0:?} does not exist")]
    NoTemplate(String),
    /// A part did not compile or render (strict mode: a missing variable is an error).
    #[error("template {template:?}, {part}: {error}")]
    Part { template: String, part: &'static str, error: minijinja::Error },
    #[error("template {0:?}: the subject rendered empty or on several lines")]
    Subject(String),
    #[error("{field}: {error}")]
    Header { field: String, error: String },
}

/// The name a message's own (inline) template goes by in errors.
const INLINE: &str = "(inline)";

fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_undefined_behavior(UndefinedBehavior::Strict);
    // A body's last line break is part of it (literal content renders as given).
    // (The default delimiters: the build cannot fail.)
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder().keep_trailing_newline(true).build() {
        env.set_syntax(syntax);
    }
    // Escape by the part being rendered, not by a file name.
    env.set_auto_escape_callback(|name| {
        if name == "html" { minijinja::AutoEscape::Html } else { minijinja::AutoEscape::None }
    });
    // minijinja's HTML escape also writes `/` as `&#x2f;`, which HTML does not need and which
    // mangles links for readers of the source (and some link trackers): escape `& < > " '` only,
    // for auto-escaped output and the `escape`/`e` filters alike.
    env.set_formatter(|out, state, value| {
        if *state.auto_escape() == minijinja::AutoEscape::Html && !value.is_safe() {
            out.write_str(&html_escape(&value.to_string())).map_err(minijinja::Error::from)
        } else {
            minijinja::escape_formatter(out, state, value)
        }
    });
    for name in ["escape", "e"] {
        env.add_filter(name, |value: minijinja::Value| {
            if value.is_safe() { value } else { minijinja::Value::from_safe_string(html_escape(&value.to_string())) }
        });
    }
    env
}

/// Text made safe inside HTML elements and quoted attributes: `&`, `<`, `>`, `"` and `'`.
fn html_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#x27;"),
            c => out.push(c),
        }
    }
    out
}

/// Whether a template's parts compile (checked when a template is stored).
pub fn compile_check(subject: &str, text: Option<&str>, html: Option<&str>) -> Result<(), ParamError> {
    let env = environment();
    for (part, source) in [("subject", Some(subject)), ("text", text), ("html", html)] {
        if let Some(src) = source {
            env.template_from_named_str(part, src).map_err(|e| ParamError::new(part, e.to_string()))?;
        }
    }
    Ok(())
}

/// A template's parts (stored or inline, named `name` in errors) rendered with `data`.
fn render_parts(
    name: &str,
    subject: &str,
    text: Option<&str>,
    html: Option<&str>,
    data: &BTreeMap<String, Value>,
) -> Result<Rendered, RenderError> {
    let env = environment();
    let render = |part: &'static str, src: &str| -> Result<String, RenderError> {
        env.template_from_named_str(part, src)
            .and_then(|tpl| tpl.render(minijinja::value::Serde(data)))
            .map_err(|error| RenderError::Part { template: name.to_owned(), part, error })
    };
    let subject = render("subject", subject)?;
    if subject.contains(['\r', '\n']) || subject.trim().is_empty() {
        return Err(RenderError::Subject(name.to_owned()));
    }
    Ok(Rendered {
        subject,
        text: text.map(|s| render("text", s)).transpose()?,
        html: html.map(|s| render("html", s)).transpose()?,
        headers: vec![],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> SendParams {
        serde_json::from_value(v).unwrap()
    }

    fn base() -> Value {
        json!({"from": "Acme <noreply@acme.example>", "to": ["a@example.com"], "subject": "Hi", "text": "Hello"})
    }

    #[test]
    fn a_plain_message_passes_and_bad_fields_are_named() {
        assert_eq!(params(base()).check(), Ok(()));
        let field = |patch: Value| {
            let mut v = base();
            v.as_object_mut().unwrap().extend(patch.as_object().unwrap().clone());
            params(v).check().unwrap_err().field
        };
        assert_eq!(field(json!({"from": "nobody"})), "from");
        assert_eq!(field(json!({"to": []})), "to");
        assert_eq!(field(json!({"to": ["ok@example.com", "bad"]})), "to[1]");
        assert_eq!(field(json!({"to": (0..51).map(|i| format!("r{i}@example.com")).collect::<Vec<_>>()})), "to");
        assert_eq!(field(json!({"subject": "two\nlines"})), "subject");
        assert_eq!(field(json!({"template": "welcome"})), "template");
        assert_eq!(field(json!({"text": "Hi {{ name }}"})), "text");
        assert_eq!(field(json!({"html": "<p>{% if %}</p>"})), "html");
        assert_eq!(field(json!({"headers": {"Subject": "x"}})), "headers.Subject");
        assert_eq!(field(json!({"headers": {"X-Ok": "a\r\nBcc: evil@example.com"}})), "headers.X-Ok");
        assert_eq!(field(json!({"tags": {"relay_job_id": "x"}})), "tags.relay_job_id");
        assert_eq!(field(json!({"tags": {"campaign": "spring sale"}})), "tags.campaign");
    }

    #[test]
    fn templates_render_strictly_and_escape_html_only() {
        let t = Template {
            name: "welcome".into(),
            subject: "Welcome, {{ name }}".into(),
            text_body: Some("Hi {{ name }}".into()),
            html_body: Some("<p>Hi {{ name }}</p>".into()),
            updated_at: chrono::Utc::now(),
        };
        let p = params(
            json!({"from": "a@acme.example", "to": ["b@example.com"], "template": "welcome", "data": {"name": "<Bo>"}}),
        );
        assert_eq!(p.check(), Ok(()));
        let r = p.render(Some(&t)).unwrap();
        assert_eq!(r.subject, "Welcome, <Bo>");
        assert_eq!(r.text.as_deref(), Some("Hi <Bo>"));
        assert_eq!(r.html.as_deref(), Some("<p>Hi &lt;Bo&gt;</p>"));
        let missing = params(json!({"from": "a@acme.example", "to": ["b@example.com"], "template": "welcome"}));
        let e = missing.render(Some(&t)).unwrap_err().to_string();
        assert!(e.contains("undefined"), "{e}");
        assert!(missing.render(None).unwrap_err().to_string().contains("does not exist"));
        assert!(compile_check("{{ oops", None, None).is_err());
    }

    #[test]
    fn inline_content_renders_with_data_urlencode_works_and_links_keep_their_slashes() {
        let p = params(json!({"from": "a@acme.example", "to": ["b@example.com"], "subject": "Hi {{ name }}",
            "text": "Hi {{ name }}\n", "html": "<a href=\"{{ link }}?q={{ q|urlencode }}\">{{ name|e }}</a>",
            "data": {"name": "Bo & 'Al'", "link": "https://acme.example/a/b", "q": "x y/z"}}));
        assert_eq!(p.check(), Ok(()));
        let r = p.render(None).unwrap();
        assert_eq!(r.subject, "Hi Bo & 'Al'");
        assert_eq!(r.text.as_deref(), Some("Hi Bo & 'Al'\n"), "the trailing line break is kept");
        assert_eq!(
            r.html.as_deref(),
            Some("<a href=\"https://acme.example/a/b?q=x%20y/z\">Bo &amp; &#x27;Al&#x27;</a>")
        );
        let missing =
            params(json!({"from": "a@acme.example", "to": ["b@example.com"], "subject": "Hi {{ name }}", "text": "x"}));
        assert_eq!(missing.check().unwrap_err().field, "subject");
        assert!(missing.render(None).unwrap_err().to_string().contains("(inline)"));
    }

    #[test]
    fn bare_addresses_are_lower_case_without_display_names() {
        assert_eq!(bare("Bo <Bo@Example.COM>").as_deref(), Some("bo@example.com"));
        assert_eq!(tag_value("corr id/1"), "corr_id_1");
    }
}
