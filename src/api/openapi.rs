//! `GET /v1/openapi.json`: the OpenAPI 3.1 document of the whole HTTP API of API.md, kept in the
//! repository as `docs/openapi.json` and compiled into the binary. Operations the router does not
//! serve yet are in the document with `x-narad-served: false`.
//!
//! Owns: serving the document and the test that keeps it and the router in step (every route the
//! router knows is documented as served, every documented served route is routed, and the
//! unserved ones are exactly [`NOT_SERVED`]). Never generates the document at run time.

use crate::http::Response;

/// The document, as committed.
pub const DOCUMENT: &str = include_str!("../../docs/openapi.json");

/// Operations of API.md this build does not route yet (`x-narad-served: false` in the document).
/// A feature that adds one of these routes removes it here and flips the flag in the document.
pub const NOT_SERVED: &[&str] = &[];

/// The `200` answer.
pub fn response() -> Response {
    Response::json(200, DOCUMENT.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{routes_to, ROUTES};
    use std::collections::BTreeSet;

    /// "METHOD /path/{param}" of every operation in the document, and whether it is served.
    fn operations() -> Vec<(String, bool)> {
        let doc: serde_json::Value = serde_json::from_str(DOCUMENT).expect("document is JSON");
        assert_eq!(doc["openapi"], "3.1.0");
        let mut out = Vec::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("path item") {
                let served = op["x-narad-served"].as_bool().expect("x-narad-served");
                out.push((format!("{} {path}", method.to_uppercase()), served));
            }
        }
        out
    }

    /// A concrete request path for a pattern (`{x}` becomes `x`).
    fn sample(pattern: &str) -> (&str, String) {
        let (method, path) = pattern.split_once(' ').expect("METHOD path");
        (method, path.replace(['{', '}'], ""))
    }

    #[test]
    fn openapi_lists_every_route() {
        // Proves the document and the router agree: every route of the router's table is in the
        // document as served and its pattern routes back to it (GET ones for HEAD too); every
        // operation the document marks served is routed to the route of that pattern; the
        // unserved ones are exactly NOT_SERVED and the router answers no route for them.
        let ops = operations();
        let served: BTreeSet<&str> = ops.iter().filter(|o| o.1).map(|o| o.0.as_str()).collect();
        let unserved: BTreeSet<&str> = ops.iter().filter(|o| !o.1).map(|o| o.0.as_str()).collect();
        assert_eq!(
            ops.len(),
            served.len() + unserved.len(),
            "duplicate operation"
        );
        for r in ROUTES {
            let p = r.pattern();
            assert!(
                served.contains(p),
                "router route {p} missing from docs/openapi.json"
            );
            let (method, path) = sample(p);
            assert_eq!(routes_to(method, &path), Some(*r), "{p}");
            if method == "GET" {
                assert_eq!(routes_to("HEAD", &path), Some(*r), "HEAD {p}");
            }
        }
        for op in &served {
            let (method, path) = sample(op);
            let r = routes_to(method, &path)
                .unwrap_or_else(|| panic!("documented as served but not routed: {op}"));
            assert_eq!(r.pattern(), *op);
            assert!(ROUTES.contains(&r), "{op}: add {r:?} to api::ROUTES");
        }
        let listed: BTreeSet<&str> = NOT_SERVED.iter().copied().collect();
        assert_eq!(unserved, listed, "x-narad-served: false vs NOT_SERVED");
        for op in NOT_SERVED {
            let (method, path) = sample(op);
            assert_eq!(
                routes_to(method, &path),
                None,
                "{op} is routed now: remove it from NOT_SERVED and set x-narad-served: true"
            );
        }
        // API.md §5 has 38 routes; the document adds GET /v1/openapi.json.
        assert_eq!(ops.len(), 39);
    }
}
