//! SEMANTICS.md §8.3: a `pattern` costing more than 32 steps per byte is refused at
//! registration. The engine (the `regex` crate through jsonschema) runs in time linear in the
//! input, but the factor is the number of automaton states alive per byte, which nested counted
//! repetitions blow up: `^(?:(?:a{1,30}){1,30}){1,30}$` took 388 µs per byte of `aaa…` here
//! (a 1 MiB payload: ~7 minutes of a shard), where ordinary patterns take 1-35 ns. The engine does
//! not report its steps, so each pattern is timed, as the validator itself runs it, on probe
//! strings made of its own characters (the input that keeps such states alive), in thread CPU
//! time: more than [`PROBE_NS_PER_BYTE_MAX`] (about 32 steps of ~30 ns) refuses it. The gap
//! between the two kinds is four orders of magnitude, so the bound does not depend on the host.

use serde_json::{json, Value};

/// CPU time per probe byte above which a pattern is refused.
pub const PROBE_NS_PER_BYTE_MAX: u64 = 1_000;
/// Length of one probe string.
const PROBE_BYTES: usize = 64;
/// Distinct probe characters tried per pattern.
const PROBE_CHARS_MAX: usize = 12;
/// Fixed allowance per probe (the validator's own call overhead).
const PROBE_OVERHEAD_NS: u64 = 100_000;

/// Every `pattern` and `patternProperties` key of the subschemas `nodes` (a document's
/// [`super::walk::all`], with their locations) costs at most [`PROBE_NS_PER_BYTE_MAX`] per byte on its
/// probes. `Err` names the first that does not.
pub fn check(
    nodes: &[(String, &Value)],
    options: impl Fn() -> jsonschema::ValidationOptions<'static>,
) -> Result<(), String> {
    for (ptr, v) in nodes {
        let Some(o) = v.as_object() else { continue };
        if let Some(p) = o.get("pattern").and_then(Value::as_str) {
            probe(p, &options).map_err(|e| format!("pattern {p:?} at '{ptr}/pattern' {e}"))?;
        }
        if let Some(pp) = o.get("patternProperties").and_then(Value::as_object) {
            for p in pp.keys() {
                probe(p, &options).map_err(|e| {
                    format!("patternProperties key {p:?} at '{ptr}/patternProperties' {e}")
                })?;
            }
        }
    }
    Ok(())
}

/// Times the pattern on strings of each of its characters repeated, then a `!` (no match at the
/// end, so every state is followed through).
fn probe(
    pattern: &str,
    options: &impl Fn() -> jsonschema::ValidationOptions<'static>,
) -> Result<(), String> {
    // A pattern the engine refuses is reported by the schema build with its own text.
    let Ok(v) = options().build(&json!({ "pattern": pattern })) else {
        return Ok(());
    };
    let mut chars: Vec<char> = Vec::new();
    for c in pattern.chars().chain(['a', '0', ' ']) {
        if !"\\^$.|?*+()[]{}".contains(c) && !chars.contains(&c) {
            chars.push(c);
        }
        if chars.len() == PROBE_CHARS_MAX {
            break;
        }
    }
    for c in chars {
        let mut s: String = std::iter::repeat_n(c, PROBE_BYTES / c.len_utf8().max(1)).collect();
        s.push('!');
        let input = Value::String(s);
        let t0 = thread_cpu_ns();
        let _ = v.is_valid(&input);
        let spent = thread_cpu_ns().saturating_sub(t0);
        let bound = PROBE_OVERHEAD_NS + PROBE_NS_PER_BYTE_MAX * PROBE_BYTES as u64;
        if spent > bound {
            return Err(format!(
                "costs more than 32 steps per byte ({} ns per byte of {c:?} repeated)",
                spent / PROBE_BYTES as u64
            ));
        }
    }
    Ok(())
}

/// CPU time of the calling thread, in nanoseconds (preemption and steal not counted); 0 when the
/// clock cannot be read, which lets every probe pass.
fn thread_cpu_ns() -> u64 {
    narad_io::sys::thread_cpu_time_ns().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts() -> jsonschema::ValidationOptions<'static> {
        jsonschema::options()
            .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(2 << 20))
    }

    fn check_doc(doc: &Value) -> Result<(), String> {
        use crate::schema::walk;
        check(&walk::all(doc, walk::SUBSCHEMAS_SCAN_MAX).unwrap(), opts)
    }

    #[test]
    fn nested_counted_repetition_is_refused_and_ordinary_patterns_pass() {
        // Proves the §8.3 cost bound: the blow-up pattern of the s20 audit (seconds per KiB) is
        // refused with its location, wherever it sits; everyday patterns are accepted.
        let bad = r"^(?:(?:a{1,30}){1,30}){1,30}$";
        let e = check_doc(&json!({"properties": {"n": {"pattern": bad}}})).unwrap_err();
        assert!(
            e.contains("at '/properties/n/pattern' costs more than 32 steps per byte"),
            "{e}"
        );
        let e = check_doc(&json!({"patternProperties": {bad: true}})).unwrap_err();
        assert!(e.starts_with("patternProperties key"), "{e}");
        for ok in [
            r"^[A-Za-z0-9._%+-]+@[A-Za-z0-9.-]+\.[A-Za-z]{2,}$",
            r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$",
            r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})$",
            r"^(foo|bar|baz|qux|[a-z]{3,12})+$",
            r"a{1,1000}",
            r"(a{1,100}){1,100}",
            r"^\p{L}{1,64}$",
        ] {
            check_doc(&json!({"items": {"pattern": ok}})).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }
}
