//! Request bodies (and their nested objects) must be JSON objects.
//!
//! serde's derived `Deserialize` for a struct also accepts a JSON array
//! of its fields in declaration order, so `["hi", true]` would be read as
//! `{"inputs": "hi", "normalize": true}`: a client bug answered with 200.
//! [`Object`] accepts a map only, and [`object`] does the same for a field.

use std::fmt;
use std::marker::PhantomData;

use serde::de::value::MapAccessDeserializer;
use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};

/// `T`, read only from a JSON object.
pub struct Object<T>(pub T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Object<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        object(d).map(Object)
    }
}

/// For `#[serde(deserialize_with = "object")]` on a nested struct field.
pub fn object<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<T, D::Error> {
    d.deserialize_map(MapOnly(PhantomData))
}

struct MapOnly<T>(PhantomData<T>);

impl<'de, T: Deserialize<'de>> Visitor<'de> for MapOnly<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::deserialize(MapAccessDeserializer::new(map))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Req {
        inputs: String,
        #[serde(default)]
        truncate: bool,
    }

    fn read(text: &str) -> Result<Req, String> {
        serde_json::from_str::<Object<Req>>(text)
            .map(|o| o.0)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn objects_only() {
        assert_eq!(
            read(r#"{"inputs": "hi", "truncate": true}"#).unwrap(),
            Req {
                inputs: "hi".into(),
                truncate: true
            }
        );
        // The plain derive takes the array; Object refuses it.
        assert!(serde_json::from_str::<Req>(r#"["hi", true]"#).is_ok());
        for bad in [r#"["hi", true]"#, r#""hi""#, "5", "null", "true"] {
            let err = read(bad).unwrap_err();
            assert!(err.contains("expected a JSON object"), "{bad}: {err}");
        }
        // Field errors still name the field.
        let err = read(r#"{"inputs": "hi", "truncat": true}"#).unwrap_err();
        assert!(err.contains("unknown field `truncat`"), "{err}");
        let err = read(r#"{"inputs": 5}"#).unwrap_err();
        assert!(err.contains("invalid type: integer `5`"), "{err}");
    }
}
