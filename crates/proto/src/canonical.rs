//! Canonical JSON (RFC 8785 style) and SHA-256 digests.
//!
//! Object keys are sorted by their UTF-16 code units, there is no
//! insignificant whitespace, strings are escaped minimally, and output is
//! UTF-8. airlock's schemas carry only integers, so a non-integer number is
//! refused instead of being given an ECMAScript rendering.

use crate::error::{Code, Error, Result};
use serde::Serialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Deepest nesting a canonical value may have.
pub const MAX_DEPTH: usize = 64;

/// Renders `value` canonically.
pub fn to_canonical_string(value: &Value) -> Result<String> {
    let mut out = String::new();
    write_value(value, &mut out, 0)?;
    Ok(out)
}

/// Serialises any `Serialize` value and renders it canonically.
pub fn canonical_of<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    let value = serde_json::to_value(value)
        .map_err(|e| Error::with(Code::CANONICAL_JSON_UNSUPPORTED, e.to_string()))?;
    to_canonical_string(&value)
}

/// SHA-256 of the canonical rendering, as 64 lowercase hex digits.
pub fn digest_of<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    Ok(sha256_hex(canonical_of(value)?.as_bytes()))
}

/// SHA-256 of raw bytes, as 64 lowercase hex digits.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// True when `s` is 64 lowercase hexadecimal digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

fn write_value(value: &Value, out: &mut String, depth: usize) -> Result<()> {
    if depth > MAX_DEPTH {
        return Err(Error::with(
            Code::CANONICAL_JSON_UNSUPPORTED,
            format!("nested deeper than {MAX_DEPTH}"),
        ));
    }
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => {
            if let Some(i) = n.as_i64() {
                out.push_str(&i.to_string());
            } else if let Some(u) = n.as_u64() {
                out.push_str(&u.to_string());
            } else {
                return Err(Error::with(
                    Code::CANONICAL_JSON_UNSUPPORTED,
                    "non-integer number",
                ));
            }
        }
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(item, out, depth + 1)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            out.push('{');
            for (i, key) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(key, out);
                out.push(':');
                write_value(&map[key], out, depth + 1)?;
            }
            out.push('}');
        }
    }
    Ok(())
}

fn write_string(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{08}' => out.push_str("\\b"),
            '\u{09}' => out.push_str("\\t"),
            '\u{0a}' => out.push_str("\\n"),
            '\u{0c}' => out.push_str("\\f"),
            '\u{0d}' => out.push_str("\\r"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        let v = json!({"b": 1, "a": [true, null, {"d": "x", "c": -2}]});
        assert_eq!(
            to_canonical_string(&v).unwrap(),
            r#"{"a":[true,null,{"c":-2,"d":"x"}],"b":1}"#
        );
    }

    #[test]
    fn sorts_by_utf16_code_units_not_bytes() {
        // U+E000 sorts after U+1F600 in UTF-8 byte order but before it in UTF-16.
        let v = json!({"\u{1F600}": 1, "\u{E000}": 2});
        assert_eq!(
            to_canonical_string(&v).unwrap(),
            "{\"\u{1F600}\":1,\"\u{E000}\":2}"
        );
    }

    #[test]
    fn escapes_minimally() {
        let v = json!("a\"b\\c\n\u{1}é/");
        assert_eq!(
            to_canonical_string(&v).unwrap(),
            "\"a\\\"b\\\\c\\n\\u0001é/\""
        );
    }

    #[test]
    fn refuses_floats_and_deep_nesting() {
        assert_eq!(
            to_canonical_string(&json!(1.5)).unwrap_err().code,
            Code::CANONICAL_JSON_UNSUPPORTED
        );
        let mut v = json!(0);
        for _ in 0..(MAX_DEPTH + 2) {
            v = json!([v]);
        }
        assert!(to_canonical_string(&v).is_err());
    }

    #[test]
    fn digest_is_sha256_of_canonical_bytes() {
        let v = json!({"b": 2, "a": 1});
        assert_eq!(digest_of(&v).unwrap(), sha256_hex(br#"{"a":1,"b":2}"#));
        assert!(is_sha256_hex(&digest_of(&v).unwrap()));
        assert!(!is_sha256_hex(&"A".repeat(64)));
    }
}
