//! Object keys matched to struct fields the way Go's `encoding/json` matches them, for the admin
//! bodies of [`super::body::decode_strict`]: an exact match first, else a case-insensitive one,
//! and a key given twice (in any letter case) takes its last value. Existing clients and curl
//! scripts of the original send `{"Name": ...}` or repeat a key and get what Go gave them.
//!
//! [`GoKeys`] is a deserializer over the text of one JSON value. A struct reads its object's
//! members as raw text first (one pass, in document order), renames and de-duplicates them, then
//! hands each value to a `GoKeys` of its own, so nested structs (grant elements) match the same
//! way. Options and arrays pass the wrapping on; every other value is read by `serde_json` from
//! the same text, so `RawValue` fields (schemas) keep their bytes and their own keys untouched.

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, Deserialize, IntoDeserializer, Visitor};
use serde_json::value::RawValue;

/// Deserializer over the text of one JSON value (already known to be well formed).
#[derive(Clone, Copy, Debug)]
pub struct GoKeys<'de>(pub &'de str);

/// The name `serde_json` gives the newtype a `RawValue` deserializes through.
const RAW_VALUE_TOKEN: &str = "$serde_json::private::RawValue";

impl<'de> GoKeys<'de> {
    fn json(self) -> serde_json::Deserializer<serde_json::de::StrRead<'de>> {
        serde_json::Deserializer::from_str(self.0)
    }

    fn starts_with(self, c: u8) -> bool {
        self.0.trim_start().as_bytes().first() == Some(&c)
    }
}

/// The index in `fields` of the field `key` names: the one with exactly that name, else the
/// first equal to it without regard to letter case (Go's rule); `None` for a key no field takes
/// (the struct refuses it). Allocates nothing.
fn field_index(key: &str, fields: &[&str]) -> Option<usize> {
    fn folded(s: &str) -> impl Iterator<Item = char> + '_ {
        s.chars().flat_map(char::to_lowercase)
    }
    fields
        .iter()
        .position(|f| *f == key)
        .or_else(|| fields.iter().position(|f| folded(f).eq(folded(key))))
}

/// An object's members in document order, values as raw text.
struct Members<'de>(Vec<(String, &'de RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: de::MapAccess<'de>>(self, mut m: A) -> Result<Members<'de>, A::Error> {
                // One iteration per member of a body already bounded in size.
                let mut out = Vec::new();
                while let Some(k) = m.next_key::<String>()? {
                    out.push((k, m.next_value::<&'de RawValue>()?));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

impl<'de> IntoDeserializer<'de, serde_json::Error> for GoKeys<'de> {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

macro_rules! forward_to_json {
    ($($method:ident)*) => {$(
        fn $method<V: Visitor<'de>>(self, v: V) -> Result<V::Value, serde_json::Error> {
            de::Deserializer::$method(&mut self.json(), v)
        }
    )*};
}

impl<'de> de::Deserializer<'de> for GoKeys<'de> {
    type Error = serde_json::Error;

    forward_to_json! {
        deserialize_any deserialize_bool deserialize_i8 deserialize_i16 deserialize_i32
        deserialize_i64 deserialize_i128 deserialize_u8 deserialize_u16 deserialize_u32
        deserialize_u64 deserialize_u128 deserialize_f32 deserialize_f64 deserialize_char
        deserialize_str deserialize_string deserialize_bytes deserialize_byte_buf
        deserialize_unit deserialize_map deserialize_identifier deserialize_ignored_any
    }

    fn deserialize_option<V: Visitor<'de>>(self, v: V) -> Result<V::Value, serde_json::Error> {
        if self.0.trim() == "null" {
            v.visit_none()
        } else {
            v.visit_some(self)
        }
    }

    fn deserialize_seq<V: Visitor<'de>>(self, v: V) -> Result<V::Value, serde_json::Error> {
        if !self.starts_with(b'[') {
            return de::Deserializer::deserialize_seq(&mut self.json(), v);
        }
        let items = Vec::<&'de RawValue>::deserialize(&mut self.json())?;
        let mut seq = SeqDeserializer::new(items.into_iter().map(|r| GoKeys(r.get())));
        let value = v.visit_seq(&mut seq)?;
        seq.end()?;
        Ok(value)
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, serde_json::Error> {
        if !self.starts_with(b'{') {
            return de::Deserializer::deserialize_struct(&mut self.json(), name, fields, v);
        }
        let Members(members) = Members::deserialize(&mut self.json())?;
        // Later members replace earlier ones naming the same field; the field keeps the place
        // of its first mention (`slot`: one lookup per member, so a body of many keys costs
        // what reading it costs). Unknown keys pass as they are, for the struct to refuse.
        let mut slot: Vec<Option<usize>> = vec![None; fields.len()];
        let mut named: Vec<(String, &'de RawValue)> = Vec::new();
        for (key, value) in members {
            match field_index(&key, fields) {
                Some(i) => match slot[i] {
                    Some(at) => named[at].1 = value,
                    None => {
                        slot[i] = Some(named.len());
                        named.push((fields[i].to_string(), value));
                    }
                },
                None => named.push((key, value)),
            }
        }
        let mut map = MapDeserializer::new(named.into_iter().map(|(k, r)| (k, GoKeys(r.get()))));
        let value = v.visit_map(&mut map)?;
        map.end()?;
        Ok(value)
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        v: V,
    ) -> Result<V::Value, serde_json::Error> {
        if name == RAW_VALUE_TOKEN {
            de::Deserializer::deserialize_newtype_struct(&mut self.json(), name, v)
        } else {
            v.visit_newtype_struct(self)
        }
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        v: V,
    ) -> Result<V::Value, serde_json::Error> {
        de::Deserializer::deserialize_unit_struct(&mut self.json(), name, v)
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        len: usize,
        v: V,
    ) -> Result<V::Value, serde_json::Error> {
        de::Deserializer::deserialize_tuple(&mut self.json(), len, v)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        name: &'static str,
        len: usize,
        v: V,
    ) -> Result<V::Value, serde_json::Error> {
        de::Deserializer::deserialize_tuple_struct(&mut self.json(), name, len, v)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        name: &'static str,
        variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, serde_json::Error> {
        de::Deserializer::deserialize_enum(&mut self.json(), name, variants, v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug, Default)]
    #[serde(deny_unknown_fields)]
    struct Body {
        name: Option<String>,
        retention_ms: Option<i64>,
        schema: Option<Box<RawValue>>,
        tags: Option<Vec<Inner>>,
    }

    #[derive(serde::Deserialize, Debug, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        label: String,
    }

    fn go(text: &str) -> Result<Body, String> {
        Body::deserialize(GoKeys(text)).map_err(|e| e.to_string())
    }

    /// The plain fields of a decoded body, for comparing.
    type Plain = (Option<String>, Option<i64>, Option<Vec<Inner>>);

    fn plain(text: &str) -> Result<Plain, String> {
        go(text).map(|b| (b.name, b.retention_ms, b.tags))
    }

    #[test]
    fn keys_match_fields_as_go_matches_them() {
        // Proves exact keys decode as before, other letter cases reach the same field, a repeated
        // key (in any case) takes its last value, nested structs in arrays match the same way,
        // and unknown keys are still refused.
        assert_eq!(
            plain(r#"{"name":"a","retention_ms":5}"#),
            Ok((Some("a".into()), Some(5), None))
        );
        assert_eq!(
            plain(r#"{"Name":"a","RETENTION_MS":5}"#),
            plain(r#"{"name":"a","retention_ms":5}"#)
        );
        assert_eq!(
            go(r#"{"name":"a","NAME":"b"}"#).unwrap().name.as_deref(),
            Some("b")
        );
        assert_eq!(
            go(r#"{"name":"a","name":"b"}"#).unwrap().name.as_deref(),
            Some("b")
        );
        assert_eq!(
            go(r#"{"tags":[{"Label":"x"},{"LABEL":"y","label":"z"}]}"#)
                .unwrap()
                .tags,
            Some(vec![
                Inner { label: "x".into() },
                Inner { label: "z".into() }
            ])
        );
        assert_eq!(
            plain(r#"{"name":null,"tags":null}"#),
            Ok((None, None, None))
        );
        let e = go(r#"{"name":"a","nmae":1}"#).unwrap_err();
        assert!(e.starts_with("unknown field `nmae`"), "{e}");
        let e = go(r#"{"tags":[{"label":"x","y":1}]}"#).unwrap_err();
        assert!(e.starts_with("unknown field `y`"), "{e}");
        let e = go(r#"{"retention_ms":"5"}"#).unwrap_err();
        assert!(
            e.starts_with("invalid type: string \"5\", expected i64"),
            "{e}"
        );
    }

    #[test]
    fn many_keys_refuse_at_the_first_unknown_and_keep_the_last_repeat() {
        // Proves the answers for bodies of many keys: distinct unknown keys are refused at the
        // first, a key repeated in several letter cases keeps its last value. (Their cost is
        // not asserted here: see the commit that made the matching one pass.)
        let unknown = (0..2_000)
            .map(|i| format!(r#""k{i}":0"#))
            .collect::<Vec<_>>();
        let e = go(&format!("{{{}}}", unknown.join(","))).unwrap_err();
        assert!(e.starts_with("unknown field `k0`"), "{e}");
        let repeated = (0..2_000)
            .map(|i| format!(r#""{}":"n{i}""#, ["Name", "NAME", "name"][i % 3]))
            .collect::<Vec<_>>();
        let b = go(&format!("{{{}}}", repeated.join(","))).unwrap();
        assert_eq!(b.name.as_deref(), Some("n1999"));
    }

    #[test]
    fn raw_values_keep_their_bytes_and_their_keys() {
        // Proves a RawValue field (a schema) is handed over byte for byte: its own keys keep
        // their letter case and duplicates, whatever the key naming the field looked like.
        let schema = r#"{"Type":"object","type" : "object","Properties":{"A":{}}}"#;
        let body = format!(r#"{{"SCHEMA":{schema}}}"#);
        assert_eq!(go(&body).unwrap().schema.unwrap().get(), schema);
    }
}
