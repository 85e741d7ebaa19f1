//! RFC 2047 encoded words (`=?utf-8?b?YS5leGU=?=`), decoded as a mail client decodes them to
//! show a name: so a file name is checked for what the recipient sees (`mime::check`).

use base64::Engine as _;

/// Why an encoded word cannot be shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WordError {
    #[error("an encoded word that does not decode: =?{0}")]
    Undecodable(String),
    #[error("an encoded word in a charset no one knows: {0}")]
    UnknownCharset(String),
}

/// The name as a mail client shows it: RFC 2047 encoded words (`=?utf-8?b?YS5leGU=?=`,
/// `=?iso-8859-1?q?a=2Eexe?=`) decoded, the space between two of them dropped. An encoded word
/// in a charset no one knows, or whose text does not decode, is an error.
pub fn decode(name: &str) -> Result<String, WordError> {
    let mut out = String::new();
    let mut rest = name;
    let mut after_word = false;
    while let Some(start) = rest.find("=?") {
        let (before, word) = rest.split_at(start);
        let Some((decoded, len)) = encoded_word(&word[2..]) else {
            out.push_str(before);
            out.push_str("=?");
            rest = &word[2..];
            after_word = false;
            continue;
        };
        if !(after_word && before.chars().all(char::is_whitespace)) {
            out.push_str(before);
        }
        out.push_str(&decoded?);
        rest = &word[2 + len..];
        after_word = true;
    }
    out.push_str(rest);
    Ok(out)
}

/// One encoded word after its `=?`: `charset?B|Q?text?=`; its decoded text and the length
/// it takes up. `None` when this is not an encoded word.
fn encoded_word(s: &str) -> Option<(Result<String, WordError>, usize)> {
    let mut fields = s.splitn(4, '?');
    let (charset, encoding, text, end) = (fields.next()?, fields.next()?, fields.next()?, fields.next()?);
    let token = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_graphic() && c != '?');
    if !end.starts_with('=') || !token(charset) || !token(encoding) || !text.chars().all(|c| c.is_ascii_graphic()) {
        return None;
    }
    let len = charset.len() + encoding.len() + text.len() + 4;
    let bytes = match encoding {
        "b" | "B" => base64::engine::general_purpose::STANDARD_NO_PAD.decode(text.trim_end_matches('=')).ok(),
        "q" | "Q" => quoted(text),
        _ => None,
    };
    // RFC 2231 lets a language follow the charset: `utf-8*en`.
    let charset = charset.split('*').next().unwrap_or_default();
    let decoded = match (bytes, encoding_rs::Encoding::for_label(charset.as_bytes())) {
        (Some(bytes), Some(charset)) => Ok(charset.decode_without_bom_handling(&bytes).0.into_owned()),
        (None, _) => Err(WordError::Undecodable(s[..len].to_owned())),
        (_, None) => Err(WordError::UnknownCharset(charset.to_owned())),
    };
    Some((decoded, len))
}

/// The bytes of RFC 2047's Q encoding: `_` a space, `=XX` a byte, anything else itself.
fn quoted(text: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(text.len());
    let mut bytes = text.bytes();
    while let Some(b) = bytes.next() {
        match b {
            b'_' => out.push(b' '),
            b'=' => {
                let hex = [bytes.next()?, bytes.next()?];
                out.push(u8::from_str_radix(std::str::from_utf8(&hex).ok()?, 16).ok()?);
            }
            _ => out.push(b),
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encoded_words_decode_as_a_mail_client_shows_them() {
        assert_eq!(decode("=?utf-8?b?YS5leGU=?=").unwrap(), "a.exe");
        assert_eq!(decode("=?UTF-8?Q?Z=C3=BCrich_2026.pdf?=").unwrap(), "Zürich 2026.pdf");
        assert_eq!(decode("x =?utf-8?b?YS4=?= \t=?utf-8*en?q?exe?= y").unwrap(), "x a.exe y");
        assert_eq!(decode("a=?b.pdf").unwrap(), "a=?b.pdf", "not an encoded word");
        assert_eq!(decode("=?iso-8859-1?q?caf=E9.txt?=").unwrap(), "café.txt");
        assert!(decode("=?klingon?b?YS5leGU=?=").is_err());
        assert!(decode("=?utf-8?q?a=ZZ?=").is_err());
    }
}
