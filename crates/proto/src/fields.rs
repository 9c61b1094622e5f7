//! A strict reader for JSON objects: the first stage of every parse.
//!
//! Unknown fields are refused, each field is read with the code that names
//! it, and no value is coerced from another type.

use crate::error::{Code, Error, Result};
use serde_json::{Map, Value};

/// A JSON object being read strictly.
#[derive(Debug)]
pub struct Obj<'a> {
    map: &'a Map<String, Value>,
    what: &'static str,
}

impl<'a> Obj<'a> {
    /// Reads `value` as an object, refusing anything else with `code`.
    pub fn new(value: &'a Value, what: &'static str, code: Code) -> Result<Self> {
        match value {
            Value::Object(map) => Ok(Obj { map, what }),
            _ => Err(Error::with(code, format!("{what} is not a JSON object"))),
        }
    }

    /// Refuses any field not in `allowed`.
    pub fn only(&self, allowed: &[&str]) -> Result<()> {
        for key in self.map.keys() {
            if !allowed.contains(&key.as_str()) {
                return Err(Error::with(
                    Code::MESSAGE_INVALID,
                    format!("unknown field {key:?} in {}", self.what),
                ));
            }
        }
        Ok(())
    }

    /// True when the field is present (even if null).
    pub fn has(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// The raw value of a field.
    pub fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key)
    }

    /// Field names, for exact-set checks.
    pub fn keys(&self) -> impl Iterator<Item = &'a str> {
        self.map.keys().map(String::as_str)
    }

    /// A required non-blank string of at most `max` bytes.
    pub fn str(&self, key: &str, code: Code, max: usize) -> Result<&'a str> {
        match self.map.get(key) {
            Some(Value::String(s)) if !s.trim().is_empty() => {
                if s.len() > max {
                    Err(Error::with(
                        code,
                        format!("{}.{key} is longer than {max} bytes", self.what),
                    ))
                } else {
                    Ok(s)
                }
            }
            Some(_) => Err(Error::with(
                code,
                format!("{}.{key} must be a non-empty string", self.what),
            )),
            None => Err(Error::with(code, format!("{}.{key} is missing", self.what))),
        }
    }

    /// An optional string (absent or null is `None`); otherwise as [`Obj::str`].
    pub fn opt_str(&self, key: &str, code: Code, max: usize) -> Result<Option<&'a str>> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(_) => self.str(key, code, max).map(Some),
        }
    }

    /// A string that may be empty (content fields), at most `max` bytes.
    pub fn text(&self, key: &str, code: Code, max: usize) -> Result<&'a str> {
        match self.map.get(key) {
            Some(Value::String(s)) if s.len() <= max => Ok(s),
            Some(Value::String(_)) => Err(Error::with(
                Code::FIELD_BOUNDS_EXCEEDED,
                format!("{}.{key} is longer than {max} bytes", self.what),
            )),
            _ => Err(Error::with(
                code,
                format!("{}.{key} must be a string", self.what),
            )),
        }
    }

    /// A required integer (never a bool or a float) within `range`.
    pub fn int(&self, key: &str, code: Code, range: std::ops::RangeInclusive<i64>) -> Result<i64> {
        let n = match self.map.get(key) {
            Some(Value::Number(n)) if n.is_i64() || n.is_u64() => n.as_i64(),
            _ => None,
        };
        match n {
            Some(n) if range.contains(&n) => Ok(n),
            Some(n) => Err(Error::with(
                code,
                format!("{}.{key} = {n} is outside {range:?}", self.what),
            )),
            None => Err(Error::with(
                code,
                format!("{}.{key} must be an integer", self.what),
            )),
        }
    }

    /// A required boolean.
    pub fn bool(&self, key: &str, code: Code) -> Result<bool> {
        match self.map.get(key) {
            Some(Value::Bool(b)) => Ok(*b),
            _ => Err(Error::with(
                code,
                format!("{}.{key} must be true or false", self.what),
            )),
        }
    }

    /// A required array of at most `max` items.
    pub fn array(&self, key: &str, code: Code, max: usize) -> Result<&'a [Value]> {
        match self.map.get(key) {
            Some(Value::Array(items)) if items.len() <= max => Ok(items),
            Some(Value::Array(items)) => Err(Error::with(
                Code::FIELD_BOUNDS_EXCEEDED,
                format!(
                    "{}.{key} has {} items, at most {max}",
                    self.what,
                    items.len()
                ),
            )),
            _ => Err(Error::with(
                code,
                format!("{}.{key} must be a list", self.what),
            )),
        }
    }

    /// An array that may be absent or null (then empty).
    pub fn opt_array(&self, key: &str, code: Code, max: usize) -> Result<&'a [Value]> {
        match self.map.get(key) {
            None | Some(Value::Null) => Ok(&[]),
            Some(_) => self.array(key, code, max),
        }
    }
}

/// Parses bytes as JSON, refusing oversized input before parsing.
pub fn parse_json(bytes: &[u8], max: usize) -> Result<Value> {
    if bytes.len() > max {
        return Err(Error::with(
            Code::FIELD_BOUNDS_EXCEEDED,
            format!("message is {} bytes, at most {max}", bytes.len()),
        ));
    }
    serde_json::from_slice(bytes).map_err(|e| Error::with(Code::MESSAGE_INVALID, e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn refuses_unknown_fields_and_wrong_types() {
        let v = json!({"a": "x", "n": true, "f": 1.0, "z": 1});
        let o = Obj::new(&v, "t", Code::MESSAGE_INVALID).unwrap();
        assert_eq!(
            o.only(&["a", "n", "f"]).unwrap_err().code,
            Code::MESSAGE_INVALID
        );
        assert_eq!(
            o.int("n", Code::GENERATION_INVALID, 0..=9)
                .unwrap_err()
                .code,
            Code::GENERATION_INVALID
        );
        assert_eq!(
            o.int("f", Code::GENERATION_INVALID, 0..=9)
                .unwrap_err()
                .code,
            Code::GENERATION_INVALID
        );
        assert_eq!(o.int("z", Code::GENERATION_INVALID, 0..=9).unwrap(), 1);
        assert_eq!(
            o.int("z", Code::GENERATION_INVALID, 2..=9)
                .unwrap_err()
                .code,
            Code::GENERATION_INVALID
        );
        assert_eq!(
            o.str("n", Code::TASK_ID_INVALID, 9).unwrap_err().code,
            Code::TASK_ID_INVALID
        );
        assert_eq!(o.str("a", Code::TASK_ID_INVALID, 9).unwrap(), "x");
        assert!(Obj::new(&json!([]), "t", Code::MESSAGE_INVALID).is_err());
    }

    #[test]
    fn bounds_are_enforced() {
        let v = json!({"s": "abcdef", "l": [1, 2, 3]});
        let o = Obj::new(&v, "t", Code::MESSAGE_INVALID).unwrap();
        assert!(o.str("s", Code::TASK_ID_INVALID, 5).is_err());
        assert_eq!(
            o.array("l", Code::MESSAGE_INVALID, 2).unwrap_err().code,
            Code::FIELD_BOUNDS_EXCEEDED
        );
        assert_eq!(
            parse_json(b"{}", 1).unwrap_err().code,
            Code::FIELD_BOUNDS_EXCEEDED
        );
        assert_eq!(
            parse_json(b"{", 10).unwrap_err().code,
            Code::MESSAGE_INVALID
        );
    }
}
