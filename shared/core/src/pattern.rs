//! Pieces of the regular expressions the schemas state, shared by the task types' own schema
//! rules (`Task::schema_rules`, `Task::document_rules`) and the OpenAPI document
//! (`api::constraints`): text classes and names in any letter case.

/// A string without a NUL character: every string the server takes (`api::extract`).
pub const NO_NUL: &str = "^[^\\x00]*$";

/// Text with a character that is not white space (what `str::trim` leaves non-empty), no NUL.
pub const NON_BLANK: &str = "^[^\\x00]*[^\\x00\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x00]*$";

/// One line (no CR or LF) with a character that is not white space, no NUL.
pub const ONE_LINE: &str = "^[^\\x00\\r\\n]*[^\\x00\\t\\n\\v\\f\\r \\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000][^\\x00\\r\\n]*$";

/// 1 to 200 characters, none a control character (`job::terms`' keys a client names).
pub const PRINTABLE: &str = "^[^\\x00-\\x1f\\x7f-\\x9f]{1,200}$";

/// A name in any letter case, as a pattern (`Te` is `[Tt][Ee]`).
pub fn any_case(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphabetic() {
                format!("[{}{}]", c.to_ascii_uppercase(), c.to_ascii_lowercase())
            } else {
                c.to_string()
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_in_any_case_matches_every_casing_and_nothing_else() {
        let re = regex::Regex::new(&format!("^{}$", any_case("Te-1"))).unwrap();
        for n in ["te-1", "TE-1", "tE-1"] {
            assert!(re.is_match(n), "{n}");
        }
        for n in ["te_1", "te-2", "tea-1"] {
            assert!(!re.is_match(n), "{n}");
        }
    }
}
