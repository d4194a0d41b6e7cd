//! Refusal of schema shapes whose validation cost explodes (SEMANTICS.md §8.4): a cycle of
//! references that stays at one instance location (through `$ref`, `allOf`, `anyOf`, `oneOf`,
//! `not`, `if`/`then`/`else` or `dependentSchemas`) and more than [`PATHS_TO_ONE_MAX`] distinct
//! same-location paths from one subschema to another (the "billion laughs" of `allOf` pairs).
//!
//! Pure analysis of the document; work and memory are bounded by [`PATH_ENTRIES_MAX`].

use std::collections::HashMap;

use serde_json::Value;

use super::walk;

/// Most distinct paths at one instance location from one subschema to another.
pub const PATHS_TO_ONE_MAX: u32 = 64;
/// Most (subschema, reachable subschema) pairs the analysis keeps before refusing as too costly.
pub const PATH_ENTRIES_MAX: usize = 1 << 18;

/// `Err` names the shape and where it is.
pub fn check(doc: &Value) -> Result<(), String> {
    let Some(nodes) = walk::all(doc, walk::SUBSCHEMAS_SCAN_MAX) else {
        return Err("too many subschemas".into());
    };
    let index: HashMap<usize, usize> = nodes
        .iter()
        .enumerate()
        .map(|(i, (_, v))| (*v as *const Value as usize, i))
        .collect();
    // Same-location edges.
    let mut edges: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, (_, v)) in nodes.iter().enumerate() {
        walk::children(v, |_, kw, sub| {
            if walk::SAME_LEVEL.contains(&kw) || kw == "dependentSchemas" || kw == "dependencies" {
                if let Some(&j) = index.get(&(sub as *const Value as usize)) {
                    edges[i].push(j);
                }
            }
        });
        for kw in ["$ref", "$dynamicRef", "$recursiveRef"] {
            if let Some(r) = v.get(kw).and_then(Value::as_str) {
                if let Some((_, t)) = walk::resolve(doc, r) {
                    if let Some(&j) = index.get(&(t as *const Value as usize)) {
                        edges[i].push(j);
                    }
                }
            }
        }
    }
    // Iterative depth-first search: post-order gives a reverse topological order; a grey
    // successor is a cycle.
    const WHITE: u8 = 0;
    const GREY: u8 = 1;
    const BLACK: u8 = 2;
    let mut colour = vec![WHITE; nodes.len()];
    let mut order = Vec::with_capacity(nodes.len());
    for start in 0..nodes.len() {
        if colour[start] != WHITE {
            continue;
        }
        let mut stack = vec![(start, 0usize)];
        colour[start] = GREY;
        while let Some((n, next)) = stack.last_mut() {
            let n = *n;
            if let Some(&m) = edges[n].get(*next) {
                *next += 1;
                match colour[m] {
                    WHITE => {
                        colour[m] = GREY;
                        stack.push((m, 0));
                    }
                    GREY => {
                        return Err(format!(
                            "reference cycle at one instance location through '{}'",
                            nodes[m].0
                        ))
                    }
                    _ => {}
                }
            } else {
                colour[n] = BLACK;
                order.push(n);
                stack.pop();
            }
        }
    }
    // Paths from each node to each same-location descendant, children before parents.
    let mut paths: Vec<HashMap<usize, u32>> = vec![HashMap::new(); nodes.len()];
    let mut entries = 0usize;
    for &n in &order {
        let mut mine: HashMap<usize, u32> = HashMap::new();
        for &m in &edges[n] {
            *mine.entry(m).or_insert(0) += 1;
            for (&t, &c) in &paths[m] {
                let e = mine.entry(t).or_insert(0);
                *e = e.saturating_add(c);
            }
        }
        if let Some((&t, _)) = mine.iter().find(|(_, &c)| c > PATHS_TO_ONE_MAX) {
            return Err(format!(
                "more than {PATHS_TO_ONE_MAX} paths at one instance location lead from '{}' to '{}'",
                nodes[n].0, nodes[t].0
            ));
        }
        entries += mine.len();
        if entries > PATH_ENTRIES_MAX {
            return Err("reference structure too costly to validate".into());
        }
        paths[n] = mine;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn billion_laughs_is_refused() {
        // Proves doubling allOf chains are refused once a target is reachable by > 64 paths,
        // and a chain of 6 doublings (64 paths) is still accepted.
        let chain = |n: usize| {
            let mut defs = serde_json::Map::new();
            defs.insert("a0".into(), json!({"type": "string"}));
            for i in 1..=n {
                let r = format!("#/$defs/a{}", i - 1);
                defs.insert(
                    format!("a{i}"),
                    json!({"allOf": [{"$ref": r}, {"$ref": r}]}),
                );
            }
            json!({"$defs": defs, "$ref": format!("#/$defs/a{n}")})
        };
        assert!(check(&chain(5)).is_ok());
        let e = check(&chain(8)).unwrap_err();
        assert!(e.contains("more than 64 paths"), "{e}");
    }

    #[test]
    fn long_same_level_chains_hit_the_entry_bound() {
        // Proves PATH_ENTRIES_MAX: a 500-link allOf chain (each link reaching every later one)
        // is refused as too costly, while a 100-link chain passes.
        let chain = |n: usize| {
            let mut defs = serde_json::Map::new();
            defs.insert(format!("a{n}"), json!({"type": "string"}));
            for i in 0..n {
                defs.insert(
                    format!("a{i}"),
                    json!({"allOf": [{"$ref": format!("#/$defs/a{}", i + 1)}]}),
                );
            }
            json!({"$defs": defs, "$ref": "#/$defs/a0"})
        };
        assert!(check(&chain(100)).is_ok());
        let e = check(&chain(500)).unwrap_err();
        assert!(e.contains("too costly"), "{e}");
    }

    #[test]
    fn same_level_cycles_are_refused_but_recursion_through_data_is_fine() {
        // Proves a $ref loop through `not` is refused, while a tree schema recursing through
        // `properties`/`items` (which descend into the instance) is accepted.
        let e = check(&json!({"$defs":{"a":{"not":{"$ref":"#/$defs/a"}}},"$ref":"#/$defs/a"}))
            .unwrap_err();
        assert!(e.contains("cycle"), "{e}");
        assert!(check(&json!({"$ref":"#"})).is_err());
        let tree =
            json!({"type":"object","properties":{"kids":{"type":"array","items":{"$ref":"#"}}}});
        assert!(check(&tree).is_ok());
    }
}
