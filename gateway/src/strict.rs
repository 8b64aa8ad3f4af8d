//! A request body read as JSON the way every reader reads it alike: an
//! object that names a key twice is refused, wherever it is. The gateway
//! reads the last of two (serde_json's maps), a provider may read the first,
//! so a body with both `"max_tokens": 1` and `"max_tokens": 100000` would
//! be checked on one value and run on the other.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// Parses `bytes` as JSON; an object with a key given twice is an error
/// naming the key. serde_json's own bounds hold: nesting past 128 levels,
/// a lone surrogate, a number out of range are errors too.
pub fn parse(bytes: &[u8]) -> Result<Value, serde_json::Error> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let value = Strict.deserialize(&mut de)?;
    de.end()?;
    Ok(value)
}

/// A JSON value whose objects name each key once.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number that is not finite"))
    }

    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(Strict)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut object = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(de::Error::custom(format_args!(
                    "the key {key:?} is given twice in one object"
                )));
            }
            let value = map.next_value_seed(Strict)?;
            object.insert(key, value);
        }
        Ok(Value::Object(object))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_given_twice_anywhere_is_refused() {
        for body in [
            r#"{"max_tokens": 1, "max_tokens": 100000}"#,
            r#"{"messages": [{"role": "user", "role": "assistant"}]}"#,
            r#"{"a": {"b": [1, {"c": 1, "d": 2, "c": 3}]}}"#,
            r#"{"\u006d": 1, "m": 2}"#,
        ] {
            let e = parse(body.as_bytes()).expect_err(body).to_string();
            assert!(e.contains("given twice"), "{body}: {e}");
        }
    }

    #[test]
    fn a_body_without_repeats_reads_as_serde_json_reads_it() {
        let body = r#"{"model": "m", "n": 2, "t": -1.5, "s": [true, null, "x"], "o": {"k": {}}}"#;
        let strict = parse(body.as_bytes()).unwrap();
        let loose: Value = serde_json::from_str(body).unwrap();
        assert_eq!(strict, loose);
        assert!(parse(b"{} {}").is_err(), "trailing values");
        assert!(parse(br#"{"s": "\ud800"}"#).is_err(), "a lone surrogate");
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert!(
            parse(deep.as_bytes()).is_err(),
            "nesting past serde_json's bound"
        );
    }
}
