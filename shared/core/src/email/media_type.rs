//! Media types as a client gives them (`Part::content_type`, `Attachment::content_type`):
//! parsed by RFC 2045's grammar, and why one is refused.

use mail_builder::headers::content_type::ContentType;

use crate::plain::NameValue;

/// Why a media type (`media_type`), or a part's (`mime::part_type`), is refused, in the words
/// the API answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MediaTypeError {
    #[error("1 to 255 ASCII characters, no control characters")]
    Text,
    #[error("{0:?} is not a media type (type/subtype)")]
    Essence(String),
    #[error("{0:?}: a parameter is name=value")]
    NoValue(String),
    #[error("{media_type:?}: {name:?} is not a parameter name")]
    ParamName { media_type: String, name: String },
    #[error("{0:?}: an unterminated quoted value")]
    Unterminated(String),
    #[error("{media_type:?}: parameter {name} has no valid value (quote it)")]
    BadValue { media_type: String, name: String },
    #[error("{media_type:?}: parameter {name} given twice")]
    Twice { media_type: String, name: String },
    #[error("{0:?}: parameters are separated by ';'")]
    Separator(String),
    /// A part's type: not text, or plain text or HTML (given as `text` and `html`).
    #[error("a text/* type other than text/plain and text/html (give those as `text` and `html`)")]
    NotExtraText,
    #[error("parts are sent as UTF-8 (charset=utf-8, or no charset)")]
    Charset,
    /// A calendar part without its iTIP method; the methods it may name.
    #[error("text/calendar names its iTIP method (RFC 5546): method={{{0}}}")]
    NoMethod(String),
    #[error("method {method:?} is not an iTIP method (RFC 5546): one of {methods}")]
    Method { method: String, methods: String },
}

/// A media type, its type and subtype lower-cased, its parameters' names lower-cased.
#[derive(Debug, Clone, PartialEq)]
pub struct MediaType {
    pub essence: String,
    pub params: Vec<NameValue>,
}

impl MediaType {
    pub(super) fn param(&self, name: &str) -> Option<&str> {
        self.params.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    /// The `Content-Type` as sent; a text part says it is UTF-8.
    pub(super) fn header(&self, text: bool) -> ContentType<'static> {
        let mut ct = ContentType::new(self.essence.clone());
        for (n, v) in &self.params {
            ct = ct.attribute(n.clone(), v.clone());
        }
        if text && self.param("charset").is_none() {
            ct = ct.attribute("charset", "utf-8");
        }
        ct
    }

    /// As the preview shows it.
    pub fn to_text(&self) -> String {
        let mut s = self.essence.clone();
        for (n, v) in &self.params {
            s.push_str(&format!("; {n}={v}"));
        }
        s
    }
}

fn is_token(c: char) -> bool {
    c.is_ascii_graphic() && !"()<>@,;:\\\"/[]?=".contains(c)
}

/// Parse `type/subtype; name=value; name="quoted value"` (RFC 2045 5.1), ASCII only.
pub fn media_type(s: &str) -> Result<MediaType, MediaTypeError> {
    if s.is_empty() || s.len() > 255 || !s.is_ascii() || s.chars().any(|c| c.is_ascii_control()) {
        return Err(MediaTypeError::Text);
    }
    let (essence, mut rest) = s.split_at(s.find(';').unwrap_or(s.len()));
    let Some((t, sub)) = essence.trim().split_once('/') else {
        return Err(MediaTypeError::Essence(s.to_owned()));
    };
    if t.is_empty() || sub.is_empty() || !t.chars().all(is_token) || !sub.chars().all(is_token) {
        return Err(MediaTypeError::Essence(s.to_owned()));
    }
    let mut params: Vec<NameValue> = Vec::new();
    while let Some(after) = rest.strip_prefix(';') {
        let after = after.trim_start();
        let Some((name, value)) = after.split_once('=') else {
            return Err(MediaTypeError::NoValue(s.to_owned()));
        };
        let name = name.trim().to_ascii_lowercase();
        if name.is_empty() || !name.chars().all(is_token) {
            return Err(MediaTypeError::ParamName { media_type: s.to_owned(), name });
        }
        let value = value.trim_start();
        let (value, left) = if let Some(quoted) = value.strip_prefix('"') {
            let mut v = String::new();
            let mut chars = quoted.char_indices();
            let mut end = None;
            while let Some((i, c)) = chars.next() {
                match c {
                    '\\' => v.extend(chars.next().map(|(_, c)| c)),
                    '"' => {
                        end = Some(i + 1);
                        break;
                    }
                    c => v.push(c),
                }
            }
            let end = end.ok_or_else(|| MediaTypeError::Unterminated(s.to_owned()))?;
            (v, &quoted[end..])
        } else {
            let end = value.find(|c: char| c == ';' || c.is_ascii_whitespace()).unwrap_or(value.len());
            let token = &value[..end];
            if token.is_empty() || !token.chars().all(is_token) {
                return Err(MediaTypeError::BadValue { media_type: s.to_owned(), name });
            }
            (token.to_owned(), &value[end..])
        };
        if params.iter().any(|(n, _)| *n == name) {
            return Err(MediaTypeError::Twice { media_type: s.to_owned(), name });
        }
        params.push((name, value));
        rest = left.trim_start();
    }
    if !rest.is_empty() {
        return Err(MediaTypeError::Separator(s.to_owned()));
    }
    Ok(MediaType { essence: essence.trim().to_ascii_lowercase(), params })
}
