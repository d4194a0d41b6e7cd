//! Walking a JSON Schema document by its schema positions: which members of a schema object are
//! themselves schemas, and local reference resolution (`#`, `#/json/pointer`, `#anchor`).
//!
//! Owns only the keyword tables below; it never compiles or validates anything. Data positions
//! (`const`, `enum`, `default`, `examples`, ...) are never entered, so a property named `$ref` or
//! `title` is data, not a keyword.

use serde_json::Value;

/// Keywords whose value is one schema.
pub const SINGLE: &[&str] = &[
    "additionalProperties",
    "additionalItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "unevaluatedItems",
    "unevaluatedProperties",
    "contentSchema",
];
/// Keywords whose value is an array of schemas.
pub const ARRAY: &[&str] = &["allOf", "anyOf", "oneOf", "prefixItems"];
/// Keywords whose value is an object of schemas.
pub const MAP: &[&str] = &[
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];

/// Keywords that only annotate: changing them changes no verdict (SEMANTICS.md §8.4).
pub const ANNOTATIONS: &[&str] = &[
    "title",
    "description",
    "examples",
    "$comment",
    "default",
    "deprecated",
    "readOnly",
    "writeOnly",
];

/// Keywords applied to the same instance location as the schema holding them.
pub const SAME_LEVEL: &[&str] = &["allOf", "anyOf", "oneOf", "not", "if", "then", "else"];

/// Calls `f(pointer suffix, keyword, subschema)` for every direct subschema of `v`.
pub fn children<'a>(v: &'a Value, mut f: impl FnMut(String, &'a str, &'a Value)) {
    let Value::Object(m) = v else { return };
    for (k, sub) in m {
        let k = k.as_str();
        if SINGLE.contains(&k) {
            f(format!("/{}", escape(k)), k, sub);
        } else if ARRAY.contains(&k) {
            if let Value::Array(a) = sub {
                for (i, s) in a.iter().enumerate() {
                    f(format!("/{k}/{i}"), k, s);
                }
            }
        } else if MAP.contains(&k) {
            if let Value::Object(o) = sub {
                for (name, s) in o {
                    f(format!("/{}/{}", escape(k), escape(name)), k, s);
                }
            }
        } else if k == "items" {
            match sub {
                Value::Array(a) => {
                    for (i, s) in a.iter().enumerate() {
                        f(format!("/items/{i}"), k, s);
                    }
                }
                _ => f("/items".to_string(), k, sub),
            }
        } else if k == "dependencies" {
            // Draft 4–7: each value is a schema or an array of property names.
            if let Value::Object(o) = sub {
                for (name, s) in o {
                    if s.is_object() || s.is_boolean() {
                        f(format!("/dependencies/{}", escape(name)), k, s);
                    }
                }
            }
        }
    }
}

/// JSON Pointer escaping of one reference token.
pub fn escape(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

/// Every subschema of `root` (itself included) with its JSON pointer, depth first. Stops after
/// `max` entries and answers `None` then.
pub fn all(root: &Value, max: usize) -> Option<Vec<(String, &Value)>> {
    let mut out = Vec::new();
    let mut stack = vec![(String::new(), root)];
    while let Some((ptr, v)) = stack.pop() {
        if out.len() >= max {
            return None;
        }
        children(v, |suffix, _, s| stack.push((format!("{ptr}{suffix}"), s)));
        out.push((ptr, v));
    }
    Some(out)
}

/// Decodes the `%XX` escapes of a URI fragment.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let h = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(h, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Resolves a local reference (`#`, `#/pointer`, `#anchor`) inside `root`, returning the target
/// and its JSON pointer. `None` for anything else, or when nothing matches.
pub fn resolve<'a>(root: &'a Value, reference: &str) -> Option<(String, &'a Value)> {
    let frag = reference.strip_prefix('#')?;
    let frag = percent_decode(frag)?;
    if frag.is_empty() {
        return Some((String::new(), root));
    }
    if frag.starts_with('/') {
        return root.pointer(&frag).map(|v| (frag.clone(), v));
    }
    // A plain-name fragment: `$anchor` (2019-09+), `$dynamicAnchor`, or `$id`/`id` "#name"
    // (draft 4–7).
    let hash = format!("#{frag}");
    all(root, SUBSCHEMAS_SCAN_MAX)?.into_iter().find(|(_, v)| {
        let get = |k: &str| v.get(k).and_then(Value::as_str);
        get("$anchor") == Some(&frag)
            || get("$dynamicAnchor") == Some(&frag)
            || get("$id") == Some(&hash)
            || get("id") == Some(&hash)
    })
}

/// Most subschemas one scan looks at (a 256 KiB document holds far fewer).
pub const SUBSCHEMAS_SCAN_MAX: usize = 1 << 17;

/// Nesting depth of a JSON value: scalars 0, an object or array 1 + its deepest member.
pub fn depth(v: &Value) -> usize {
    // Iterative, so a deep document cannot exhaust the stack here.
    let mut deepest = 0;
    let mut stack = vec![(v, 0usize)];
    while let Some((v, d)) = stack.pop() {
        match v {
            Value::Object(m) => {
                deepest = deepest.max(d + 1);
                stack.extend(m.values().map(|c| (c, d + 1)));
            }
            Value::Array(a) => {
                deepest = deepest.max(d + 1);
                stack.extend(a.iter().map(|c| (c, d + 1)));
            }
            _ => {}
        }
    }
    deepest
}

/// A copy of `v` with every annotation keyword removed from every schema position.
pub fn strip_annotations(v: &Value) -> Value {
    let Value::Object(m) = v else {
        return v.clone();
    };
    let mut out = serde_json::Map::new();
    for (k, sub) in m {
        let ks = k.as_str();
        if ANNOTATIONS.contains(&ks) {
            continue;
        }
        let nv = if SINGLE.contains(&ks) {
            strip_annotations(sub)
        } else if ARRAY.contains(&ks) || (ks == "items" && sub.is_array()) {
            match sub {
                Value::Array(a) => Value::Array(a.iter().map(strip_annotations).collect()),
                other => other.clone(),
            }
        } else if MAP.contains(&ks) || ks == "dependencies" {
            match sub {
                Value::Object(o) => Value::Object(
                    o.iter()
                        .map(|(n, s)| {
                            let s = if s.is_object() {
                                strip_annotations(s)
                            } else {
                                s.clone()
                            };
                            (n.clone(), s)
                        })
                        .collect(),
                ),
                other => other.clone(),
            }
        } else if ks == "items" {
            strip_annotations(sub)
        } else {
            sub.clone()
        };
        out.insert(k.clone(), nv);
    }
    Value::Object(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn resolves_pointers_and_anchors() {
        // Proves local references resolve by pointer (with escapes) and by anchor.
        let s = json!({"$defs": {"a/b": {"type": "string"}, "c": {"$anchor": "cee", "type": "integer"}}});
        assert_eq!(
            resolve(&s, "#/$defs/a~1b").unwrap().1,
            &json!({"type": "string"})
        );
        assert_eq!(resolve(&s, "#cee").unwrap().0, "/$defs/c");
        assert_eq!(resolve(&s, "#").unwrap().0, "");
        assert!(resolve(&s, "other.json#/x").is_none());
        assert!(resolve(&s, "#/nope").is_none());
    }

    #[test]
    fn strips_annotations_only_in_schema_positions() {
        // Proves annotation keywords are removed from schemas but a property named `title` stays.
        let s = json!({"title": "t", "properties": {"title": {"type": "string", "description": "d"}},
                       "const": {"title": 1}});
        assert_eq!(
            strip_annotations(&s),
            json!({"properties": {"title": {"type": "string"}}, "const": {"title": 1}})
        );
    }

    #[test]
    fn depth_counts_containers() {
        // Proves the nesting measure: scalars 0, `[]` 1, `{"a":[1]}` 2.
        assert_eq!(depth(&json!(1)), 0);
        assert_eq!(depth(&json!([])), 1);
        assert_eq!(depth(&json!({"a": [1]})), 2);
    }
}
