//! The backward-compatibility check of SEMANTICS.md §8.4: a new schema version must accept every
//! payload the previous version accepted, checked structurally and failing closed.
//!
//! Allowed changes: add optional properties, remove names from `required`, widen `type` (add
//! types, `integer`→`number`), loosen or drop numeric bounds, decrease or drop `min*`, increase
//! or drop `max*`, add `enum`/`const` values, drop `pattern`/`format`, open
//! `additionalProperties`, widen `items`, an `anyOf` whose branches cover every old branch,
//! annotation changes. Refused: removing a property, narrowing or changing a type, adding a
//! required name, adding or tightening bounds, changing `$schema`. Any other keyword that the new
//! version has must be present, unchanged, in the old one (dropping it only loosens); that is the
//! "fail closed" rule for everything this module does not reason about.
//!
//! Adding an optional property to an old schema whose `additionalProperties` was open is allowed
//! because the spec lists it, although the old version accepted any value under that name.
//!
//! Pure functions over two documents; no I/O. Work is bounded by [`COMPARE_STEPS_MAX`].

use std::collections::HashSet;

use serde_json::{Map, Value};

use super::walk;

/// Most schema pairs one comparison visits before it refuses as too complex.
pub const COMPARE_STEPS_MAX: usize = 100_000;

/// Where and why a new version refuses something the old one accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Incompatible {
    /// JSON pointer into the new document (`""` = root).
    pub location: String,
    pub reason: String,
}

impl std::fmt::Display for Incompatible {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let loc = if self.location.is_empty() {
            "/"
        } else {
            &self.location
        };
        write!(f, "at {loc}: {}", self.reason)
    }
}

/// The seven JSON types of the type keyword.
const TYPES: [&str; 7] = [
    "null", "boolean", "integer", "number", "string", "array", "object",
];

/// Keywords this module compares itself (everything else falls under the fail-closed rule).
const HANDLED: &[&str] = &[
    "$schema",
    "$ref",
    "$defs",
    "definitions",
    "$id",
    "id",
    "$anchor",
    "$dynamicAnchor",
    "$vocabulary",
    "type",
    "enum",
    "const",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minLength",
    "maxLength",
    "minItems",
    "maxItems",
    "minProperties",
    "maxProperties",
    "pattern",
    "format",
    "required",
    "properties",
    "additionalProperties",
    "items",
    "anyOf",
    "allOf",
    "uniqueItems",
];

/// The draft a document is validated under: its `$schema` without an empty fragment, the
/// default 2020-12 when absent (so naming the default explicitly changes nothing).
fn draft_of(doc: &Value) -> Option<String> {
    match doc.get("$schema") {
        None => Some("https://json-schema.org/draft/2020-12/schema".into()),
        Some(Value::String(s)) => Some(s.strip_suffix('#').unwrap_or(s).to_string()),
        Some(_) => None,
    }
}

/// Checks that `new` accepts everything `old` accepted. Both must be registrable documents.
pub fn check(old: &Value, new: &Value) -> Result<(), Incompatible> {
    if draft_of(old) != draft_of(new) {
        return Err(Incompatible {
            location: String::new(),
            reason: "$schema changed".into(),
        });
    }
    for (doc, which) in [(old, "old"), (new, "new")] {
        if let Some(loc) = unsupported(doc) {
            return Err(Incompatible {
                location: loc.0,
                reason: format!(
                    "{} in the {which} version cannot be compared structurally; refused",
                    loc.1
                ),
            });
        }
    }
    let legacy_ref = match old.get("$schema").and_then(Value::as_str) {
        Some(s) => s.contains("draft-04") || s.contains("draft-06") || s.contains("draft-07"),
        None => false,
    };
    let mut c = Compare {
        old_root: old,
        new_root: new,
        legacy_ref,
        seen: HashSet::new(),
        seen_log: Vec::new(),
        steps: 0,
    };
    c.schema(old, new, "")
}

/// Dynamic references and embedded resources resolve in ways this module does not model: a
/// document using them can only be re-registered unchanged.
fn unsupported(doc: &Value) -> Option<(String, &'static str)> {
    let all = walk::all(doc, walk::SUBSCHEMAS_SCAN_MAX)?;
    for (ptr, v) in all {
        for kw in ["$dynamicRef", "$recursiveRef"] {
            if v.get(kw).is_some() {
                return Some((ptr, kw));
            }
        }
        if !ptr.is_empty() {
            for kw in ["$id", "id"] {
                if v.get(kw)
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.starts_with('#'))
                {
                    return Some((ptr, "an embedded $id"));
                }
            }
        }
    }
    None
}

struct Compare<'a> {
    old_root: &'a Value,
    new_root: &'a Value,
    /// Draft 4–7: keywords beside `$ref` are ignored.
    legacy_ref: bool,
    /// Pairs (old, new) already being compared: assumed compatible (recursive schemas).
    seen: HashSet<(usize, usize)>,
    /// Insertion order of `seen`, so a failed `anyOf` attempt can take its assumptions back.
    seen_log: Vec<(usize, usize)>,
    steps: usize,
}

fn err(loc: &str, reason: impl Into<String>) -> Result<(), Incompatible> {
    Err(Incompatible {
        location: loc.to_string(),
        reason: reason.into(),
    })
}

/// Number equality across integer and float forms.
fn num_eq(a: &Value, b: &Value) -> bool {
    match (a.as_f64(), b.as_f64()) {
        (Some(x), Some(y)) if a.is_number() && b.is_number() => x == y,
        _ => a == b,
    }
}

/// JSON equality where numbers compare by value (`1` equals `1.0`).
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(_), Value::Number(_)) => num_eq(a, b),
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

/// A text that equal JSON values share; top-level numbers compare by value.
fn canonical(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if v.is_number() => format!("n:{f}"),
        _ => v.to_string(),
    }
}

fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(n) if n.as_f64().is_some_and(|f| f.fract() == 0.0) => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// The values a schema allows when it has `const` or `enum`.
fn allowed_values(m: &Map<String, Value>) -> Option<Vec<&Value>> {
    if let Some(c) = m.get("const") {
        return Some(vec![c]);
    }
    match m.get("enum") {
        Some(Value::Array(a)) => Some(a.iter().collect()),
        _ => None,
    }
}

/// The types a schema may accept: its `type`, narrowed by `const`/`enum` when present.
fn types(m: &Map<String, Value>) -> Vec<&'static str> {
    let mut out: Vec<&'static str> = match m.get("type") {
        Some(Value::String(s)) => TYPES.iter().copied().filter(|t| t == s).collect(),
        Some(Value::Array(a)) => TYPES
            .iter()
            .copied()
            .filter(|t| a.iter().any(|x| x.as_str() == Some(t)))
            .collect(),
        _ => TYPES.to_vec(),
    };
    if out.contains(&"number") && !out.contains(&"integer") {
        out.push("integer");
    }
    if let Some(vals) = allowed_values(m) {
        out.retain(|t| vals.iter().any(|v| type_of(v) == *t));
    }
    out
}

fn lower_bound(m: &Map<String, Value>) -> Option<(f64, bool)> {
    let draft4_excl = m.get("exclusiveMinimum").and_then(Value::as_bool);
    let mut b: Option<(f64, bool)> = m
        .get("minimum")
        .and_then(Value::as_f64)
        .map(|v| (v, draft4_excl == Some(true)));
    if let Some(x) = m.get("exclusiveMinimum").and_then(Value::as_f64) {
        if b.is_none_or(|(v, _)| x >= v) {
            b = Some((x, true));
        }
    }
    b
}

fn upper_bound(m: &Map<String, Value>) -> Option<(f64, bool)> {
    let draft4_excl = m.get("exclusiveMaximum").and_then(Value::as_bool);
    let mut b: Option<(f64, bool)> = m
        .get("maximum")
        .and_then(Value::as_f64)
        .map(|v| (v, draft4_excl == Some(true)));
    if let Some(x) = m.get("exclusiveMaximum").and_then(Value::as_f64) {
        if b.is_none_or(|(v, _)| x <= v) {
            b = Some((x, true));
        }
    }
    b
}

fn empty_map() -> &'static Map<String, Value> {
    static EMPTY: std::sync::OnceLock<Map<String, Value>> = std::sync::OnceLock::new();
    EMPTY.get_or_init(Map::new)
}

impl<'a> Compare<'a> {
    /// `old` ⊆ `new` at new-document location `loc`.
    fn schema(&mut self, old: &'a Value, new: &'a Value, loc: &str) -> Result<(), Incompatible> {
        self.steps += 1;
        if self.steps > COMPARE_STEPS_MAX {
            return err(loc, "schemas too complex to compare; refused");
        }
        let om: &'a Map<String, Value> = match old {
            Value::Bool(false) => return Ok(()),
            Value::Bool(true) => empty_map(),
            Value::Object(m) => m,
            _ => return err(loc, "old version is not a schema"),
        };
        let nm: &'a Map<String, Value> = match new {
            Value::Bool(true) => return Ok(()),
            Value::Bool(false) => return err(loc, "schema false accepts nothing"),
            Value::Object(m) => m,
            _ => return err(loc, "not a schema"),
        };
        let pair = (old as *const Value as usize, new as *const Value as usize);
        if !self.seen.insert(pair) {
            return Ok(());
        }
        self.seen_log.push(pair);
        // Draft 4–7 ignore every keyword beside `$ref`.
        if self.legacy_ref {
            if let Some(r) = om.get("$ref").and_then(Value::as_str) {
                let Some((_, t)) = walk::resolve(self.old_root, r) else {
                    return err(
                        loc,
                        format!("$ref {r:?} of the old version does not resolve"),
                    );
                };
                return self.schema(t, new, loc);
            }
        }
        if let Some(r) = nm.get("$ref").and_then(Value::as_str) {
            let Some((_, nt)) = walk::resolve(self.new_root, r) else {
                return err(loc, format!("$ref {r:?} does not resolve"));
            };
            let rloc = format!("{loc}/$ref");
            match om.get("$ref").and_then(Value::as_str) {
                Some(or) if !self.legacy_ref => {
                    let Some((_, ot)) = walk::resolve(self.old_root, or) else {
                        return err(
                            loc,
                            format!("$ref {or:?} of the old version does not resolve"),
                        );
                    };
                    self.schema(ot, nt, &rloc)?;
                }
                _ => self.schema(old, nt, &rloc)?,
            }
            if self.legacy_ref {
                return Ok(());
            }
        }
        let old_types = types(om);
        let may = |t: &str| old_types.contains(&t);
        self.types(nm, &old_types, loc)?;
        self.values(om, nm, loc)?;
        if may("number") || may("integer") {
            self.numbers(om, nm, loc)?;
        }
        let counts: [(&str, bool, bool); 8] = [
            ("minLength", true, may("string")),
            ("maxLength", false, may("string")),
            ("minItems", true, may("array")),
            ("maxItems", false, may("array")),
            ("minProperties", true, may("object")),
            ("maxProperties", false, may("object")),
            ("minContains", true, may("array")),
            ("maxContains", false, may("array")),
        ];
        for (kw, is_min, applies) in counts {
            if applies {
                self.count(om, nm, kw, is_min, loc)?;
            }
        }
        if may("string") {
            for kw in ["pattern", "format"] {
                if let Some(nv) = nm.get(kw) {
                    if om.get(kw) != Some(nv) {
                        let what = if om.contains_key(kw) {
                            "changed"
                        } else {
                            "added"
                        };
                        return err(loc, format!("{kw} {what}"));
                    }
                }
            }
        }
        if may("object") {
            self.objects(om, nm, loc)?;
        }
        if may("array") {
            self.arrays(om, nm, loc)?;
        }
        self.any_of(old, om, nm, loc)?;
        self.all_of(old, om, nm, loc)?;
        // Fail closed on every keyword not reasoned about above.
        for (k, nv) in nm {
            let ks = k.as_str();
            if HANDLED.contains(&ks) || walk::ANNOTATIONS.contains(&ks) {
                continue;
            }
            if !om.get(k).is_some_and(|ov| json_eq(ov, nv)) {
                let what = if om.contains_key(k) {
                    "changed"
                } else {
                    "added"
                };
                return err(
                    loc,
                    format!("{k} {what} (only an unchanged {k} is accepted)"),
                );
            }
        }
        Ok(())
    }

    fn types(
        &self,
        nm: &Map<String, Value>,
        old_types: &[&str],
        loc: &str,
    ) -> Result<(), Incompatible> {
        if !nm.contains_key("type") {
            return Ok(());
        }
        let new_types = types(&{
            let mut m = Map::new();
            if let Some(t) = nm.get("type") {
                m.insert("type".into(), t.clone());
            }
            m
        });
        for t in old_types {
            // `integer` is listed beside `number` only when derived; a bare old `number` needs
            // `number` in the new version.
            if *t == "integer" && old_types.contains(&"number") {
                continue;
            }
            if !new_types.contains(t) {
                return err(loc, format!("type {t:?} no longer allowed"));
            }
        }
        Ok(())
    }

    fn values(
        &self,
        om: &Map<String, Value>,
        nm: &Map<String, Value>,
        loc: &str,
    ) -> Result<(), Incompatible> {
        let Some(new_vals) = allowed_values(nm) else {
            return Ok(());
        };
        let kw = if nm.contains_key("const") {
            "const"
        } else {
            "enum"
        };
        let Some(old_vals) = allowed_values(om) else {
            return err(loc, format!("{kw} added"));
        };
        // A set of canonical texts keeps large enums linear (`1` and `1.0` share one text).
        let new_set: HashSet<String> = new_vals.iter().map(|v| canonical(v)).collect();
        for v in old_vals {
            if !new_set.contains(&canonical(v)) {
                return err(loc, format!("{kw}: value {v} no longer allowed"));
            }
        }
        // `const` and `enum` together: both must admit the old values.
        if nm.contains_key("const") && nm.contains_key("enum") {
            if let Some(Value::Array(e)) = nm.get("enum") {
                for v in allowed_values(om).unwrap_or_default() {
                    if !e.iter().any(|n| json_eq(n, v)) {
                        return err(loc, format!("enum: value {v} no longer allowed"));
                    }
                }
            }
        }
        Ok(())
    }

    fn numbers(
        &self,
        om: &Map<String, Value>,
        nm: &Map<String, Value>,
        loc: &str,
    ) -> Result<(), Incompatible> {
        // Draft 4 boolean exclusives are only accepted unchanged.
        for kw in ["exclusiveMinimum", "exclusiveMaximum"] {
            if nm.get(kw).is_some_and(Value::is_boolean)
                || om.get(kw).is_some_and(Value::is_boolean)
            {
                for k in [
                    kw,
                    if kw == "exclusiveMinimum" {
                        "minimum"
                    } else {
                        "maximum"
                    },
                ] {
                    if nm.contains_key(k)
                        && !nm.get(k).zip(om.get(k)).is_some_and(|(a, b)| json_eq(a, b))
                    {
                        return err(loc, format!("{k} changed"));
                    }
                }
            }
        }
        // Every new lower bound must be implied by the old one.
        if let Some((n, n_excl)) = lower_bound(nm) {
            let kw = if n_excl {
                "exclusiveMinimum"
            } else {
                "minimum"
            };
            match lower_bound(om) {
                None => return err(loc, format!("{kw} added")),
                Some((o, o_excl)) => {
                    let implied = o > n || (o == n && (o_excl || !n_excl));
                    if !implied {
                        return err(loc, format!("{kw} raised"));
                    }
                }
            }
        }
        if let Some((n, n_excl)) = upper_bound(nm) {
            let kw = if n_excl {
                "exclusiveMaximum"
            } else {
                "maximum"
            };
            match upper_bound(om) {
                None => return err(loc, format!("{kw} added")),
                Some((o, o_excl)) => {
                    let implied = o < n || (o == n && (o_excl || !n_excl));
                    if !implied {
                        return err(loc, format!("{kw} lowered"));
                    }
                }
            }
        }
        if let Some(n) = nm.get("multipleOf").and_then(Value::as_f64) {
            let ok = om
                .get("multipleOf")
                .and_then(Value::as_f64)
                .is_some_and(|o| {
                    let q = o / n;
                    q.is_finite() && (q - q.round()).abs() < 1e-9 && q.round() >= 1.0
                });
            if !ok {
                return err(loc, "multipleOf added or changed");
            }
        }
        Ok(())
    }

    fn count(
        &self,
        om: &Map<String, Value>,
        nm: &Map<String, Value>,
        kw: &str,
        is_min: bool,
        loc: &str,
    ) -> Result<(), Incompatible> {
        let o = om.get(kw).and_then(Value::as_f64);
        match nm.get(kw).and_then(Value::as_f64) {
            None => {
                // Without `minContains` the minimum is 1: dropping it can tighten.
                if kw == "minContains" && o.is_some_and(|o| o < 1.0) && nm.contains_key("contains")
                {
                    return err(loc, "minContains dropped (the default of 1 is stricter)");
                }
                Ok(())
            }
            Some(n) => match o {
                None => err(loc, format!("{kw} added")),
                Some(o) if is_min && n > o => err(loc, format!("{kw} raised from {o} to {n}")),
                Some(o) if !is_min && n < o => err(loc, format!("{kw} lowered from {o} to {n}")),
                Some(_) => Ok(()),
            },
        }
    }

    fn objects(
        &mut self,
        om: &'a Map<String, Value>,
        nm: &'a Map<String, Value>,
        loc: &str,
    ) -> Result<(), Incompatible> {
        let old_req: Vec<&str> = match om.get("required") {
            Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
            _ => Vec::new(),
        };
        if let Some(Value::Array(a)) = nm.get("required") {
            for r in a.iter().filter_map(Value::as_str) {
                if !old_req.contains(&r) {
                    return err(loc, format!("property {r:?} is now required"));
                }
            }
        }
        let empty = empty_map();
        let op = om
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(empty);
        let np = nm
            .get("properties")
            .and_then(Value::as_object)
            .unwrap_or(empty);
        for (name, os) in op {
            let ploc = format!("{loc}/properties/{}", walk::escape(name));
            match np.get(name) {
                Some(ns) => self.schema(os, ns, &ploc)?,
                None => return err(&ploc, format!("property {name:?} removed")),
            }
        }
        let old_ap = om.get("additionalProperties");
        for (name, ns) in np {
            if op.contains_key(name) {
                continue;
            }
            // A new optional property: values the old version let through under that name were
            // bounded only by its additionalProperties schema, if it had one.
            if let Some(ap @ Value::Object(_)) = old_ap {
                let ploc = format!("{loc}/properties/{}", walk::escape(name));
                self.schema(ap, ns, &ploc)?;
            }
        }
        let aloc = format!("{loc}/additionalProperties");
        match (old_ap, nm.get("additionalProperties")) {
            (_, None) | (_, Some(Value::Bool(true))) => {}
            (Some(Value::Bool(false)), Some(_)) => {}
            (Some(o), Some(n)) => self.schema(o, n, &aloc)?,
            (None, Some(n)) => self
                .schema(&Value::Bool(true), n, &aloc)
                .or_else(|_| err(&aloc, "additionalProperties closed"))?,
        }
        Ok(())
    }

    fn arrays(
        &mut self,
        om: &'a Map<String, Value>,
        nm: &'a Map<String, Value>,
        loc: &str,
    ) -> Result<(), Incompatible> {
        if nm.get("uniqueItems") == Some(&Value::Bool(true))
            && om.get("uniqueItems") != Some(&Value::Bool(true))
        {
            return err(loc, "uniqueItems added");
        }
        let iloc = format!("{loc}/items");
        match (om.get("items"), nm.get("items")) {
            (_, None) => Ok(()),
            (Some(o), Some(n)) if n.is_array() || o.is_array() => {
                if json_eq(o, n) {
                    Ok(())
                } else {
                    err(&iloc, "items (array form) changed")
                }
            }
            (Some(o), Some(n)) => self.schema(o, n, &iloc),
            (None, Some(n)) if n.is_array() => err(&iloc, "items added"),
            (None, Some(n)) => {
                // Without `items` every element was accepted (unless `prefixItems` bounded the
                // first ones, which the fail-closed rule keeps unchanged).
                self.schema(&Value::Bool(true), n, &iloc)
                    .or_else(|_| err(&iloc, "items added"))
            }
        }
    }

    fn any_of(
        &mut self,
        old: &'a Value,
        om: &'a Map<String, Value>,
        nm: &'a Map<String, Value>,
        loc: &str,
    ) -> Result<(), Incompatible> {
        let Some(Value::Array(nb)) = nm.get("anyOf") else {
            return Ok(());
        };
        let old_branches: Vec<&'a Value> = match om.get("anyOf") {
            Some(Value::Array(ob)) => ob.iter().collect(),
            _ => vec![old],
        };
        for (i, ob) in old_branches.into_iter().enumerate() {
            let mut covered = false;
            for (j, b) in nb.iter().enumerate() {
                let mark = self.seen_log.len();
                if self.schema(ob, b, &format!("{loc}/anyOf/{j}")).is_ok() {
                    covered = true;
                    break;
                }
                if self.steps > COMPARE_STEPS_MAX {
                    return err(loc, "schemas too complex to compare; refused");
                }
                for pair in self.seen_log.drain(mark..) {
                    self.seen.remove(&pair);
                }
            }
            if !covered {
                return err(
                    loc,
                    format!("anyOf: old branch {i} is not covered by any new branch"),
                );
            }
        }
        Ok(())
    }

    fn all_of(
        &mut self,
        old: &'a Value,
        om: &'a Map<String, Value>,
        nm: &'a Map<String, Value>,
        loc: &str,
    ) -> Result<(), Incompatible> {
        let Some(Value::Array(nb)) = nm.get("allOf") else {
            return Ok(());
        };
        match om.get("allOf") {
            Some(Value::Array(ob)) if ob.len() == nb.len() => {
                for (j, (o, n)) in ob.iter().zip(nb).enumerate() {
                    self.schema(o, n, &format!("{loc}/allOf/{j}"))?;
                }
                Ok(())
            }
            Some(_) => err(loc, "allOf changed shape"),
            None => {
                // Each new conjunct must accept everything the whole old schema accepted.
                for (j, n) in nb.iter().enumerate() {
                    self.schema(old, n, &format!("{loc}/allOf/{j}"))?;
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(o: Value, n: Value) {
        if let Err(e) = check(&o, &n) {
            panic!("expected compatible: {o} -> {n}: {e}");
        }
    }

    fn bad(o: Value, n: Value) -> String {
        match check(&o, &n) {
            Ok(()) => panic!("expected incompatible: {o} -> {n}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn allowed_changes_of_section_8_4() {
        // Proves every change the spec lists as allowed is accepted.
        let base = json!({"type":"object","required":["id","qty"],
            "properties":{"id":{"type":"string","minLength":3,"maxLength":10,"pattern":"^a","format":"uuid"},
                          "qty":{"type":"integer","minimum":1,"maximum":9,"enum":[1,2,3]},
                          "tags":{"type":"array","items":{"type":"string"},"minItems":1,"maxItems":4}},
            "additionalProperties":false});
        // add optional property
        let mut v = base.clone();
        v["properties"]["note"] = json!({"type":"string"});
        ok(base.clone(), v);
        // remove from required
        let mut v = base.clone();
        v["required"] = json!(["id"]);
        ok(base.clone(), v);
        // widen type, integer -> number
        let mut v = base.clone();
        v["properties"]["qty"]["type"] = json!(["number", "null"]);
        ok(base.clone(), v);
        // loosen / drop bounds
        let mut v = base.clone();
        v["properties"]["qty"]["minimum"] = json!(0);
        v["properties"]["qty"]
            .as_object_mut()
            .unwrap()
            .remove("maximum");
        v["properties"]["id"]["minLength"] = json!(1);
        v["properties"]["id"]["maxLength"] = json!(20);
        v["properties"]["tags"]
            .as_object_mut()
            .unwrap()
            .remove("minItems");
        v["properties"]["tags"]["maxItems"] = json!(5);
        ok(base.clone(), v);
        // add enum values
        let mut v = base.clone();
        v["properties"]["qty"]["enum"] = json!([1, 2, 3, 4]);
        ok(base.clone(), v);
        // drop pattern / format
        let mut v = base.clone();
        let id = v["properties"]["id"].as_object_mut().unwrap();
        id.remove("pattern");
        id.remove("format");
        ok(base.clone(), v);
        // open additionalProperties
        let mut v = base.clone();
        v["additionalProperties"] = json!(true);
        ok(base.clone(), v);
        // widen items
        let mut v = base.clone();
        v["properties"]["tags"]["items"] = json!({"type":["string","integer"]});
        ok(base.clone(), v);
        // annotations only
        let mut v = base.clone();
        v["title"] = json!("x");
        v["properties"]["id"]["description"] = json!("d");
        ok(base.clone(), v);
        // anyOf covering the old schema
        ok(
            json!({"type":"string"}),
            json!({"anyOf":[{"type":"integer"},{"type":"string"}]}),
        );
        ok(
            json!({"anyOf":[{"type":"integer"},{"type":"string"}]}),
            json!({"anyOf":[{"type":"string"},{"type":"number"},{"type":"null"}]}),
        );
        ok(json!({"type":"object"}), json!(true));
        ok(json!({"const":"a"}), json!({"enum":["a","b"]}));
    }

    #[test]
    fn refused_changes_name_keyword_and_location() {
        // Proves the refusals the spec lists, and that the message names keyword and location.
        let base = json!({"type":"object","required":["id"],
            "properties":{"id":{"type":"string"},"qty":{"type":"integer","minimum":1}}});
        let mut v = base.clone();
        v["properties"]["qty"]["type"] = json!("string");
        assert_eq!(
            bad(base.clone(), v),
            "at /properties/qty: type \"integer\" no longer allowed"
        );
        let mut v = base.clone();
        v["properties"].as_object_mut().unwrap().remove("qty");
        assert_eq!(
            bad(base.clone(), v),
            "at /properties/qty: property \"qty\" removed"
        );
        let mut v = base.clone();
        v["required"] = json!(["id", "qty"]);
        assert_eq!(
            bad(base.clone(), v),
            "at /: property \"qty\" is now required"
        );
        let mut v = base.clone();
        v["properties"]["qty"]["maximum"] = json!(10);
        assert_eq!(bad(base.clone(), v), "at /properties/qty: maximum added");
        let mut v = base.clone();
        v["properties"]["qty"]["minimum"] = json!(2);
        assert_eq!(bad(base.clone(), v), "at /properties/qty: minimum raised");
        let mut v = base.clone();
        v["$schema"] = json!("http://json-schema.org/draft-07/schema#");
        assert_eq!(bad(base.clone(), v), "at /: $schema changed");
        // Naming the default draft is no change (audit s20 D2).
        let mut named = base.clone();
        named["$schema"] = json!("https://json-schema.org/draft/2020-12/schema");
        assert!(check(&base, &named).is_ok() && check(&named, &base).is_ok());
        let mut v = base.clone();
        v["additionalProperties"] = json!(false);
        assert_eq!(
            bad(base.clone(), v),
            "at /additionalProperties: additionalProperties closed"
        );
        let mut v = base.clone();
        v["properties"]["id"]["pattern"] = json!("^x");
        assert_eq!(bad(base.clone(), v), "at /properties/id: pattern added");
        let mut v = base.clone();
        v["not"] = json!({"required":["x"]});
        assert!(bad(base.clone(), v).contains("not added"));
        bad(json!({"type":"number"}), json!({"type":"integer"}));
        bad(json!({"enum":[1,2]}), json!({"enum":[1]}));
        bad(json!({}), json!({"type":"object"}));
        bad(json!(true), json!(false));
        bad(
            json!({"anyOf":[{"type":"integer"},{"type":"string"}]}),
            json!({"anyOf":[{"type":"string"}]}),
        );
    }

    #[test]
    fn references_are_followed_in_both_versions() {
        // Proves a change hidden behind $ref is seen, and recursive schemas terminate.
        let o = json!({"$defs":{"q":{"type":"integer"}},"properties":{"qty":{"$ref":"#/$defs/q"}}});
        let n = json!({"$defs":{"q":{"type":"string"}},"properties":{"qty":{"$ref":"#/$defs/q"}}});
        assert_eq!(
            bad(o.clone(), n),
            "at /properties/qty/$ref: type \"integer\" no longer allowed"
        );
        let n = json!({"$defs":{"q":{"type":"number"}},"properties":{"qty":{"$ref":"#/$defs/q"}}});
        ok(o, n);
        let tree =
            json!({"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#"}}}});
        ok(tree.clone(), tree.clone());
        let mut wider = tree.clone();
        wider["properties"]["name"] = json!({"type":"string"});
        ok(tree, wider);
    }

    #[test]
    fn large_enums_compare_quickly() {
        // Proves a 50,000-value enum grown by one value is compared in linear time.
        let vals: Vec<Value> = (0..50_000).map(|i| json!(format!("v{i}"))).collect();
        let mut grown = vals.clone();
        grown.push(json!(1.0));
        let t = std::time::Instant::now();
        ok(json!({ "enum": vals.clone() }), json!({ "enum": grown }));
        // Generous: a quadratic comparison of these sizes takes minutes; a loaded CI machine
        // must not fail a linear one.
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
        bad(
            json!({ "enum": vals.clone() }),
            json!({ "enum": vals[1..].to_vec() }),
        );
        ok(json!({"enum": [1]}), json!({"enum": [1.0, 2]}));
    }

    #[test]
    fn comparison_work_is_bounded() {
        // Proves a pathological anyOf fan-out stops at COMPARE_STEPS_MAX instead of running on.
        let branches: Vec<Value> = (0..400).map(|i| json!({"const": i})).collect();
        let o = json!({"anyOf": branches.clone()});
        let mut rev = branches;
        rev.reverse();
        let n = json!({"anyOf": rev});
        let t = std::time::Instant::now();
        if let Err(e) = check(&o, &n) {
            assert!(e.reason.contains("too complex"), "{e}");
        }
        // Generous: a quadratic comparison of these sizes takes minutes; a loaded CI machine
        // must not fail a linear one.
        assert!(t.elapsed() < std::time::Duration::from_secs(20));
        // 500 old branches each tried against 500 non-matching new ones: past the budget.
        let old: Vec<Value> = (0..500).map(|i| json!({ "const": i })).collect();
        let mut new: Vec<Value> = (1000..1500).map(|i| json!({ "const": i })).collect();
        new.extend(old.iter().cloned());
        let e = check(&json!({ "anyOf": old }), &json!({ "anyOf": new })).unwrap_err();
        assert!(e.reason.contains("too complex"), "{e}");
    }
}
