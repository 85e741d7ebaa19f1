//! serde's messages in words a client reads. serde says what it expected in Rust's terms
//! (`invalid type: string "5", expected u32`, `expected struct JobRequest`); a client sent JSON
//! and needs the JSON shape: "must be a whole number between 0 and 4294967295, not a string".

/// A name and its value, in order: a header, a MIME or query parameter, a message tag. The
/// one definition of that pair the core passes around.
pub type NameValue = (String, String);

/// A value refused, with the path of the field at fault (`to`, `recipients[3].data`,
/// `params.seconds`; `.` for the whole value) and why, in a client's words.
#[derive(Debug, Clone, PartialEq, serde::Serialize, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ParamError {
    pub field: String,
    pub message: String,
}

impl ParamError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        ParamError { field: field.into(), message: message.into() }
    }

    /// The same error with its field under `parent` (`to` under `params` is `params.to`; the
    /// whole value, `.`, is `parent` itself).
    pub fn under(self, parent: &str) -> Self {
        let field = if self.field == "." { parent.to_owned() } else { format!("{parent}.{}", self.field) };
        ParamError { field, ..self }
    }
}

/// A field's error from `serde_path_to_error`: the field at fault (`.` for the whole body) and
/// the message in plain words. A missing field is named as the field at fault.
pub fn field_error(path: &serde_path_to_error::Path, inner: &dyn std::fmt::Display) -> ParamError {
    let at = path.to_string();
    let message = plain(&inner.to_string());
    match (at.as_str(), message.strip_prefix("missing field ")) {
        (".", Some(name)) => ParamError::new(name.to_owned(), message),
        (_, Some(name)) => ParamError::new(format!("{at}.{name}"), message.clone()),
        _ => ParamError::new(at, message),
    }
}

/// One serde message rewritten without Rust type names; a message it does not know and that
/// names none is kept as it is.
pub fn plain(message: &str) -> String {
    if let Some(rest) = message.strip_prefix("invalid type: ").or_else(|| message.strip_prefix("invalid value: "))
        && let Some((got, want)) = rest.rsplit_once(", expected ")
    {
        return format!("must be {}, not {}", expected(want), unexpected(got));
    }
    if let Some(rest) = message.strip_prefix("invalid length ")
        && let Some((_, want)) = rest.split_once(", expected ")
    {
        // A struct read from a JSON array: serde counts its elements.
        return if want.starts_with("struct ") {
            "must be an object, not a list".to_owned()
        } else {
            format!("must be {}", expected(want))
        };
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let (value, choices) = rest.split_once(", ").unwrap_or((rest, ""));
        return match ticked(choices).as_slice() {
            [] => format!("{} is not accepted", unticked(value)),
            names => format!("must be one of: {} (not {:?})", names.join(", "), unticked(value)),
        };
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let (name, fields) = rest.split_once(", ").unwrap_or((rest, ""));
        return match ticked(fields).as_slice() {
            [] => format!("unknown field {}; no fields are accepted here", unticked(name)),
            names => format!("unknown field {}; the fields are: {}", unticked(name), names.join(", ")),
        };
    }
    if let Some(name) = message.strip_prefix("missing field ") {
        return format!("missing field {}", unticked(name));
    }
    if let Some(name) = message.strip_prefix("duplicate field ") {
        return format!("{} is given more than once", unticked(name));
    }
    if message.starts_with("data did not match any variant of untagged enum") {
        return "is in none of the accepted forms".to_owned();
    }
    if names_a_rust_type(message) { "has the wrong type".to_owned() } else { message.to_owned() }
}

/// What serde expected (`u32`, `struct X`, `a sequence`), as a JSON shape.
fn expected(want: &str) -> String {
    macro_rules! whole {
        ($($t:ident)*) => {
            match want {
                $(stringify!($t) => return format!("a whole number between {} and {}", $t::MIN, $t::MAX),)*
                _ => {}
            }
        };
    }
    whole!(u8 u16 u32 u64 usize i8 i16 i32 i64 isize);
    let shape = match want {
        "f32" | "f64" => "a number",
        "a boolean" => "true or false",
        "a string" | "a borrowed string" | "string" => "a string",
        "a character" => "a single character",
        "a sequence" => "a list",
        "a map" => "an object",
        "unit" => "null",
        "string or map" => "one of the accepted values",
        w if w.starts_with("struct ")
            || w.starts_with("internally tagged enum ")
            || w.starts_with("struct variant ") =>
        {
            "an object"
        }
        w if w.starts_with("tuple") || w.starts_with("an array") => "a list",
        w if w.starts_with("enum ") || w.starts_with("variant identifier") || w.starts_with("field identifier") => {
            "one of the accepted values"
        }
        w if w.starts_with("unit struct ") => "null",
        w if names_a_rust_type(w) => "of another type",
        w => return w.to_owned(),
    };
    shape.to_owned()
}

/// What came instead, as serde's `Unexpected` displays it (`string "x"`, `integer `5``).
fn unexpected(got: &str) -> String {
    let number = |s: &str| s.split_once('`').map(|(_, n)| n.trim_end_matches('`').to_owned());
    match got {
        g if g.starts_with("string ") => "a string".to_owned(),
        g if g.starts_with("integer ") || g.starts_with("floating point ") => {
            number(g).unwrap_or_else(|| "a number".to_owned())
        }
        g if g.starts_with("boolean ") => number(g).unwrap_or_else(|| "a boolean".to_owned()),
        "null" | "unit value" | "Option value" => "null".to_owned(),
        "map" => "an object".to_owned(),
        "sequence" => "a list".to_owned(),
        g if g.starts_with("character ") => "a character".to_owned(),
        g if names_a_rust_type(g) => "a value of another type".to_owned(),
        g => g.to_owned(),
    }
}

/// The names between backticks: "one of `a`, `b`" → [a, b].
fn ticked(s: &str) -> Vec<&str> {
    s.split('`').skip(1).step_by(2).collect()
}

fn unticked(s: &str) -> &str {
    s.trim().trim_matches('`')
}

/// Whether `s` names a Rust type: a primitive as a word, or `struct `, `enum `, `Option<`, `Vec<`.
pub fn names_a_rust_type(s: &str) -> bool {
    const PRIMITIVES: [&str; 12] =
        ["f64", "f32", "u8", "u16", "u32", "u64", "i8", "i16", "i32", "i64", "usize", "isize"];
    s.split(|c: char| !c.is_ascii_alphanumeric()).any(|w| PRIMITIVES.contains(&w))
        || ["struct ", "enum ", "Option<", "Vec<"].iter().any(|t| s.contains(t))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        n: Option<u32>,
        i: Option<i32>,
        f: Option<f64>,
        s: Option<String>,
        b: Option<bool>,
        list: Option<Vec<Inner>>,
        kind: Option<Kind>,
        at: Option<chrono::DateTime<chrono::Utc>>,
    }

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        to: String,
    }

    #[derive(Debug, Deserialize)]
    #[serde(rename_all = "snake_case")]
    enum Kind {
        Retry,
        Cancel,
    }

    fn error(v: serde_json::Value) -> NameValue {
        let e = serde_path_to_error::deserialize::<_, Body>(v).unwrap_err();
        let ParamError { field, message } = field_error(e.path(), e.inner());
        (field, message)
    }

    #[test]
    fn serde_messages_are_said_in_json_terms() {
        let cases = [
            (json!({"n": "5"}), "n", "must be a whole number between 0 and 4294967295, not a string"),
            (json!({"n": -1}), "n", "must be a whole number between 0 and 4294967295, not -1"),
            (json!({"n": 1.5}), "n", "must be a whole number between 0 and 4294967295, not 1.5"),
            (json!({"n": 5_000_000_000u64}), "n", "must be a whole number between 0 and 4294967295, not 5000000000"),
            (json!({"i": true}), "i", "must be a whole number between -2147483648 and 2147483647, not true"),
            (json!({"f": "x"}), "f", "must be a number, not a string"),
            (json!({"s": 3}), "s", "must be a string, not 3"),
            (json!({"b": "yes"}), "b", "must be true or false, not a string"),
            (json!({"list": {}}), "list", "must be a list, not an object"),
            (json!({"list": [7]}), "list[0]", "must be an object, not 7"),
            (json!({"list": [{}]}), "list[0].to", "missing field to"),
            (json!({"list": [{"to": "a", "cc": 1}]}), "list[0].cc", "unknown field cc; the fields are: to"),
            (json!({"kind": "bogus"}), "kind", "must be one of: retry, cancel (not \"bogus\")"),
            (json!({"kind": 4}), "kind", "must be one of the accepted values, not 4"),
            (json!({"zzz": 1}), "zzz", "unknown field zzz; the fields are: n, i, f, s, b, list, kind, at"),
            (json!([1]), ".", "must be an object, not a list"),
        ];
        let wrong: Vec<_> = cases
            .iter()
            .filter(|(body, field, message)| error(body.clone()) != (field.to_string(), message.to_string()))
            .map(|(body, _, _)| format!("{body} → {:?}", error(body.clone())))
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
        let (field, message) = error(json!({"at": "yesterday"}));
        assert_eq!(field, "at");
        assert!(!names_a_rust_type(&message), "{message}");
    }

    #[test]
    fn rust_type_names_are_recognised_as_words() {
        assert!(names_a_rust_type("expected u32"));
        assert!(names_a_rust_type("expected struct JobRequest"));
        assert!(!names_a_rust_type("must be a number (int32)"));
        assert!(!names_a_rust_type("a structure"));
    }
}
