//! JSON Schema per topic (SEMANTICS.md §8): what a schema document must be to be registered,
//! whether a new version is compatible with the previous one, and the validation of produce
//! payloads on the shard that accepted them.
//!
//! Owns: the registration rules (shape, 256 KiB, nesting 64, local references only, costly
//! shapes, compilation with RE2-style patterns and asserted formats), the per-shard cache of
//! compiled validators keyed by (topic id, schema version), the per-shard validation slot that
//! bounds costly validations (one per core, as the spec's per-node bound), and the rejection
//! texts of §8.2. Never does: I/O, Raft proposals, or HTTP parsing. The version history itself
//! lives in the Raft state machine (`narad_raft::TopicMeta::schemas`), which stays the single
//! place that decides the version number, the 1000-version and byte budgets and the base-version
//! conflict; the proposer (src/api/topics.rs) calls [`check_document`] and [`compatible`] first.
//!
//! Cost bounds on the produce path: a payload is pre-scanned linearly (nesting ≤ 256, exponent
//! ≤ ±1000) before it is parsed; patterns use the linear-time `regex` engine; a rejection report
//! stops after [`REPORT_ERRORS_MAX`] errors and [`REJECTION_BYTES_MAX`] bytes. Payloads larger
//! than [`SLOT_PAYLOAD_BYTES_MIN`] and costly schemas validate under the shard's single slot; a
//! produce that waits [`SLOT_WAIT`] for it answers `503`.

mod compat;
mod cost;
mod pattern_cost;
mod payload;
pub mod walk;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use narad_io::rt::{Semaphore, SemaphorePermit};
use narad_io::types::TopicId;
use narad_raft::TopicMeta;
use serde_json::Value;

pub use compat::{Incompatible, COMPARE_STEPS_MAX};
pub use payload::{Malformed, EXPONENT_ABS_MAX, PAYLOAD_NESTING_MAX};

/// Largest schema document, as compact JSON (SEMANTICS.md §8.4).
pub const SCHEMA_BYTES_MAX: usize = 256 << 10;
/// Deepest schema document nesting.
pub const SCHEMA_NESTING_MAX: usize = 64;
/// A rejection message is cut at this many bytes (§8.2).
pub const REJECTION_BYTES_MAX: usize = 2048;
/// Errors listed in one rejection; the rest are summarised in one line.
pub const REPORT_ERRORS_MAX: usize = 16;
/// Payloads above this size validate under the shard's slot (§8.3).
pub const SLOT_PAYLOAD_BYTES_MIN: usize = 16 << 10;
/// Schemas above this size (compact JSON) count as costly and validate under the slot.
pub const COSTLY_SCHEMA_BYTES_MIN: usize = 16 << 10;
/// Schemas with more subschemas than this count as costly.
pub const COSTLY_SUBSCHEMAS_MIN: usize = 256;
/// Longest wait for the validation slot before `503`.
pub const SLOT_WAIT: Duration = Duration::from_secs(5);
/// Largest compiled pattern (`pattern`, `patternProperties`): the linear-time engine's cost per
/// byte grows with the program size, so huge repetitions (`(a{1000}){1000}`) are refused.
pub const PATTERN_BYTES_MAX: usize = 2 << 20;
/// Compiled validators kept per shard; the least recently used is dropped beyond it.
pub const VALIDATORS_CACHED_MAX: usize = 256;

/// The `503` text when the validation slot stays busy. It holds both the text of API.md §10.1
/// (`schema: validation capacity busy, retry`) and the words the Go SDK looks for
/// (`schema validation slot`, CLIENTS.md "Where this refines the rest of the spec"), so that
/// the SDK knows nothing was stored and moves to another node at once.
pub const BUSY_MESSAGE: &str =
    "schema: validation capacity busy, retry (no schema validation slot free within 5s)";
/// The `400` text for over-deep payloads (§8.2).
pub const TOO_DEEP_MESSAGE: &str = "payload nests deeper than 256 levels";

/// Why a produce was refused; the API layer picks the status for each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RejectionKind {
    /// The payload does not match the schema (or is too deep to check): the client's fault.
    Invalid,
    /// No validation capacity within [`SLOT_WAIT`]: nothing was stored, retry.
    Busy,
    /// The topic's stored schema cannot be compiled by this build: the broker's fault.
    Uncompilable,
}

/// A refused produce: why, and the error text (without the batch `message <i>: ` prefix).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub kind: RejectionKind,
    pub message: String,
}

impl Rejection {
    fn bad(message: String) -> Rejection {
        Rejection {
            kind: RejectionKind::Invalid,
            message,
        }
    }

    /// The same rejection for message `i` of a batch (API.md §10.2).
    pub fn at(self, i: usize) -> Rejection {
        Rejection {
            kind: self.kind,
            message: format!("message {i}: {}", self.message),
        }
    }
}

/// Per-shard counters for OPERATIONS.md §9.3 (`narad_schema_rejections_total{reason}` and the
/// validation count); read with [`counters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub validations: u64,
    pub rejected_depth: u64,
    pub rejected_malformed: u64,
    pub rejected_invalid: u64,
    pub rejected_busy: u64,
    /// Schema documents refused at registration for a costly reference shape (more than 64
    /// paths to one subschema, a cycle through `not`/`if`/`oneOf`, too many path entries).
    pub rejected_definition_paths: u64,
    /// Schema documents refused at registration for a `pattern` or `patternProperties` regex
    /// the linear-time engine refuses (lookarounds, backreferences, over its size limit).
    pub rejected_definition_pattern: u64,
    pub in_flight: u64,
    /// Validations run under the slot (large payloads, costly schemas), decode included, the
    /// wait for the slot excluded: `narad_schema_validation_seconds`. Others are not timed.
    pub slot_validation: narad_io::stats::Durations,
}

struct Cached {
    compiled: Result<Arc<Compiled>, String>,
    used: u64,
}

#[derive(Default)]
struct ShardSchemas {
    cache: HashMap<(TopicId, u32), Cached>,
    tick: u64,
    slot: Option<Semaphore>,
    counters: Counters,
}

thread_local! {
    // One executor per thread, so this is the shard's own state; borrows never cross an await.
    static SHARD: RefCell<ShardSchemas> = RefCell::new(ShardSchemas::default());
}

fn count(f: impl FnOnce(&mut Counters)) {
    SHARD.with(|s| f(&mut s.borrow_mut().counters));
}

/// This shard's schema counters.
pub fn counters() -> Counters {
    SHARD.with(|s| s.borrow().counters)
}

/// Builds the validator for a registered document: drafts by `$schema` (2020-12 default),
/// formats asserted, unknown formats ignored, linear-time patterns, no retrieval of anything
/// outside the document.
pub fn compile(doc: &Value) -> Result<jsonschema::Validator, String> {
    build(doc).map_err(|e| e.to_string())
}

fn build(doc: &Value) -> Result<jsonschema::Validator, jsonschema::ValidationError<'static>> {
    options().build(doc)
}

fn options() -> jsonschema::ValidationOptions<'static> {
    jsonschema::options()
        .offline()
        .should_validate_formats(true)
        .should_ignore_unknown_formats(true)
        .with_pattern_options(jsonschema::PatternOptions::regex().size_limit(PATTERN_BYTES_MAX))
}

/// A schema document refused at registration or alteration (SEMANTICS.md §8.4): the client's
/// fault; the text names the rule it broke (the API layer answers `400` with it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaRefused(pub String);

impl std::fmt::Display for SchemaRefused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for SchemaRefused {
    fn from(s: &str) -> SchemaRefused {
        SchemaRefused(s.to_string())
    }
}

/// Checks a schema document for registration (SEMANTICS.md §8.4).
pub fn check_document(doc: &Value) -> Result<(), SchemaRefused> {
    match doc {
        Value::Object(_) | Value::Bool(true) => {}
        Value::Null => return Err("invalid argument: schema cannot be removed (null)".into()),
        _ => return Err("invalid argument: schema must be a JSON object or true".into()),
    }
    let bytes = serde_json::to_vec(doc).map_or(usize::MAX, |b| b.len());
    if bytes > SCHEMA_BYTES_MAX {
        return Err(SchemaRefused(format!(
            "invalid argument: schema is {bytes} bytes; at most {SCHEMA_BYTES_MAX} are accepted"
        )));
    }
    if walk::depth(doc) > SCHEMA_NESTING_MAX {
        return Err(SchemaRefused(format!(
            "invalid argument: schema nests deeper than {SCHEMA_NESTING_MAX} levels"
        )));
    }
    let Some(all) = walk::all(doc, walk::SUBSCHEMAS_SCAN_MAX) else {
        return Err("invalid argument: schema has too many subschemas".into());
    };
    for (ptr, v) in &all {
        for kw in ["$ref", "$dynamicRef", "$recursiveRef"] {
            if let Some(r) = v.get(kw).and_then(Value::as_str) {
                if !r.starts_with('#') {
                    return Err(SchemaRefused(format!(
                        "invalid argument: schema: {kw} {r:?} at '{ptr}' points outside the document; only local references (#...) are accepted"
                    )));
                }
            }
        }
    }
    cost::check(doc).map_err(|e| {
        count(|c| c.rejected_definition_paths += 1);
        SchemaRefused(format!("invalid argument: schema: {e}"))
    })?;
    pattern_cost::check(&all, options).map_err(|e| {
        count(|c| c.rejected_definition_pattern += 1);
        SchemaRefused(format!("invalid argument: schema: {e}"))
    })?;
    build(doc).map_err(|e| {
        // The builder reports a regex its engine refuses as an invalid `regex` format.
        if matches!(e.kind(), jsonschema::error::ValidationErrorKind::Format { format } if format == "regex")
        {
            count(|c| c.rejected_definition_pattern += 1);
        }
        SchemaRefused(format!("invalid argument: schema: {e}"))
    })?;
    Ok(())
}

/// Parses the `schema` member of a create or alter body.
pub fn parse_document(raw: &serde_json::value::RawValue) -> Result<Value, SchemaRefused> {
    serde_json::from_str(raw.get()).map_err(|_| {
        // The parser gives up at 128 levels: name the limit the document broke, not its syntax.
        SchemaRefused(
            if crate::wire::reader::nesting_depth(raw.get().as_bytes()) > SCHEMA_NESTING_MAX {
                format!("invalid argument: schema nests deeper than {SCHEMA_NESTING_MAX} levels")
            } else {
                "invalid argument: schema is not valid JSON".into()
            },
        )
    })
}

/// True when `a` and `b` differ at most in annotations (re-registering `b` over `a` registers
/// nothing, SEMANTICS.md §8.4).
pub fn same_ignoring_annotations(a: &Value, b: &Value) -> bool {
    a == b || walk::strip_annotations(a) == walk::strip_annotations(b)
}

/// Checks that `new` accepts everything `old` (version `old_version`) accepted; the refusal
/// names keyword and location.
pub fn compatible(old: &Value, old_version: u32, new: &Value) -> Result<(), SchemaRefused> {
    compat::check(old, new).map_err(|e| {
        SchemaRefused(format!(
            "invalid argument: schema incompatible with version {old_version}: {e}"
        ))
    })
}

/// A compiled schema version, shared by every produce of that version on this shard.
pub struct Compiled {
    validator: jsonschema::Validator,
    topic: String,
    version: u32,
    costly: bool,
}

impl Compiled {
    pub fn new(topic: &str, version: u32, doc: &Value) -> Result<Compiled, String> {
        let validator = compile(doc)?;
        let bytes = serde_json::to_vec(doc).map_or(usize::MAX, |b| b.len());
        let subschemas = walk::all(doc, COSTLY_SUBSCHEMAS_MIN + 1).map_or(usize::MAX, |a| a.len());
        Ok(Compiled {
            validator,
            topic: topic.to_string(),
            version,
            costly: bytes >= COSTLY_SCHEMA_BYTES_MIN || subschemas > COSTLY_SUBSCHEMAS_MIN,
        })
    }

    pub fn version(&self) -> u32 {
        self.version
    }

    /// Validates one produce payload, under the shard's slot when it is large or the schema is
    /// costly, and yields afterwards so a batch does not hold the shard.
    pub async fn check(self: &Arc<Self>, payload: &[u8]) -> Result<(), Rejection> {
        self.check_within(payload, SLOT_WAIT).await
    }

    /// A slot validation runs on a validation helper thread (one per core per node), so that
    /// the shard keeps serving meanwhile and a produce waiting for the slot gets its `503` on
    /// time; the others (small payload, ordinary schema) run here.
    async fn check_within(
        self: &Arc<Self>,
        payload: &[u8],
        wait: Duration,
    ) -> Result<(), Rejection> {
        if payload.len() <= SLOT_PAYLOAD_BYTES_MIN && !self.costly {
            count(|c| c.in_flight += 1);
            let r = self.check_now(payload);
            count(|c| c.in_flight -= 1);
            narad_io::rt::yield_if_needed().await;
            return r;
        }
        let permit = acquire_slot(wait).await?;
        let t0 = std::time::Instant::now();
        count(|c| c.in_flight += 1);
        let job = {
            let me = Arc::clone(self);
            let payload = payload.to_vec();
            move || me.verdict(&payload)
        };
        let verdict = match validation_pool().submit(job) {
            Ok(slot) => slot.wait().await,
            Err(narad_io::rt::pool::Busy) => None,
        };
        count(|c| {
            c.in_flight -= 1;
            c.slot_validation.record(t0.elapsed());
        });
        drop(permit);
        match verdict {
            Some(v) => settle(v),
            None => {
                count(|c| c.rejected_busy += 1);
                Err(Rejection {
                    kind: RejectionKind::Busy,
                    message: BUSY_MESSAGE.into(),
                })
            }
        }
    }

    /// Validates here, on the calling thread (the caller bounds the cost).
    pub fn check_now(&self, payload: &[u8]) -> Result<(), Rejection> {
        settle(self.verdict(payload))
    }

    /// The outcome of validating `payload`; touches no shard state, so any thread may run it.
    fn verdict(&self, payload: &[u8]) -> Verdict {
        let v = match payload::parse(payload) {
            Ok(v) => v,
            Err(Malformed::TooDeep) => return Verdict::TooDeep,
            Err(Malformed::NotJson(e)) => return Verdict::NotJson(e),
        };
        if self.validator.is_valid(&v) {
            return Verdict::Valid;
        }
        Verdict::Invalid(self.report(&v))
    }

    /// The §8.2 report: `...failed with 'narad://schema/<topic>/<version>#'` then one
    /// `- at '<pointer>': <reason>` line per error, cut at [`REJECTION_BYTES_MAX`].
    fn report(&self, v: &Value) -> String {
        let mut out = format!(
            "invalid argument: schema: jsonschema validation failed with 'narad://schema/{}/{}#'",
            self.topic, self.version
        );
        let mut errors = self.validator.iter_errors(v);
        for e in errors.by_ref().take(REPORT_ERRORS_MAX) {
            out.push_str(&format!(
                "\n- at '{}': {}",
                e.instance_path().as_str(),
                reason(&e)
            ));
            if out.len() >= REJECTION_BYTES_MAX {
                break;
            }
        }
        if out.len() < REJECTION_BYTES_MAX && errors.next().is_some() {
            out.push_str(&format!(
                "\n- (only the first {REPORT_ERRORS_MAX} errors are reported)"
            ));
        }
        truncate(&mut out, REJECTION_BYTES_MAX);
        out
    }
}

/// What validating one payload found, before the shard counts it.
#[derive(Clone, Debug)]
enum Verdict {
    Valid,
    TooDeep,
    NotJson(String),
    /// The §8.2 report.
    Invalid(String),
}

/// Counts a verdict on this shard and turns it into the produce's answer.
fn settle(v: Verdict) -> Result<(), Rejection> {
    count(|c| c.validations += 1);
    match v {
        Verdict::Valid => Ok(()),
        Verdict::TooDeep => {
            count(|c| c.rejected_depth += 1);
            Err(Rejection::bad(TOO_DEEP_MESSAGE.into()))
        }
        Verdict::NotJson(e) => {
            count(|c| c.rejected_malformed += 1);
            Err(Rejection::bad(format!(
                "invalid argument: schema: payload is not one valid JSON text: {e}"
            )))
        }
        Verdict::Invalid(report) => {
            count(|c| c.rejected_invalid += 1);
            Err(Rejection::bad(report))
        }
    }
}

/// The node's schema validation helper threads: one per core (SEMANTICS.md §8.3's per-node
/// bound; each shard's slot admits one job at a time).
fn validation_pool() -> &'static narad_io::rt::pool::Pool {
    static POOL: std::sync::OnceLock<narad_io::rt::pool::Pool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        narad_io::rt::pool::Pool::with_threads(cores, "narad-schema")
    })
}

fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut cut = max;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
    }
}

fn instance_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn quoted_list<'a>(names: impl Iterator<Item = &'a String>) -> String {
    names
        .map(|n| format!("'{n}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The reason of one error, in the wording of the original broker's validator where it has one
/// (`missing property 'id'`, `got string, want integer`), else `<keyword>: <detail>`.
fn reason(e: &jsonschema::ValidationError<'_>) -> String {
    use jsonschema::error::{TypeKind, ValidationErrorKind as K};
    let inst = e.instance();
    let inst: &Value = inst.as_ref();
    let len = |v: &Value| match v {
        Value::String(s) => s.chars().count(),
        Value::Array(a) => a.len(),
        Value::Object(o) => o.len(),
        _ => 0,
    };
    let short = |v: &Value| {
        let mut s = v.to_string();
        truncate(&mut s, 64);
        s
    };
    match e.kind() {
        K::Required { property } => match property.as_str() {
            Some(p) => format!("missing property '{p}'"),
            None => format!("missing property {property}"),
        },
        K::Type { kind } => {
            let want = match kind {
                TypeKind::Single(t) => t.to_string(),
                TypeKind::Multiple(ts) => ts
                    .iter()
                    .map(|t| t.to_string())
                    .collect::<Vec<_>>()
                    .join(" or "),
            };
            format!("got {}, want {want}", instance_type(inst))
        }
        K::AdditionalProperties { unexpected } => {
            format!(
                "additional properties {} not allowed",
                quoted_list(unexpected.iter())
            )
        }
        K::Enum { options } => format!("value must be one of {}", short(options)),
        K::Constant { expected_value } => format!("value must be {}", short(expected_value)),
        K::Pattern { pattern } => format!("{} does not match pattern '{pattern}'", short(inst)),
        K::Format { format } => format!("{} is not valid {format}", short(inst)),
        K::Minimum { limit } => format!("minimum: got {inst}, want {limit}"),
        K::Maximum { limit } => format!("maximum: got {inst}, want {limit}"),
        K::ExclusiveMinimum { limit } => format!("exclusiveMinimum: got {inst}, want {limit}"),
        K::ExclusiveMaximum { limit } => format!("exclusiveMaximum: got {inst}, want {limit}"),
        K::MinLength { limit } => format!("minLength: got {}, want {limit}", len(inst)),
        K::MaxLength { limit } => format!("maxLength: got {}, want {limit}", len(inst)),
        K::MinItems { limit } => format!("minItems: got {}, want {limit}", len(inst)),
        K::MaxItems { limit } => format!("maxItems: got {}, want {limit}", len(inst)),
        K::MinProperties { limit } => format!("minProperties: got {}, want {limit}", len(inst)),
        K::MaxProperties { limit } => format!("maxProperties: got {}, want {limit}", len(inst)),
        K::FalseSchema => "false schema".into(),
        K::AnyOf { .. } => "anyOf failed".into(),
        K::OneOfNotValid { .. } => "oneOf failed, none matched".into(),
        K::OneOfMultipleValid { .. } => "oneOf failed, more than one matched".into(),
        K::Not { .. } => "not failed".into(),
        K::UniqueItems => "uniqueItems: items are not unique".into(),
        K::Contains => "contains: no item matches".into(),
        other => format!("{}: {e}", other.keyword()),
    }
}

/// The validator of `t`'s current schema version on this shard, compiled on first use. `None`
/// when the topic has no schema.
pub fn for_topic(t: &TopicMeta) -> Result<Option<Arc<Compiled>>, Rejection> {
    let version = t.schema_version();
    let Some(doc) = t.current_schema() else {
        return Ok(None);
    };
    let key = (t.id, version);
    let hit = SHARD.with(|s| {
        let mut s = s.borrow_mut();
        s.tick += 1;
        let tick = s.tick;
        s.cache.get_mut(&key).map(|c| {
            c.used = tick;
            c.compiled.clone()
        })
    });
    let compiled = match hit {
        Some(c) => c,
        None => {
            // Compiled outside the borrow: compiling never awaits, but keep borrows short.
            let c = Compiled::new(&t.name, version, doc).map(Arc::new);
            SHARD.with(|s| {
                let mut s = s.borrow_mut();
                // Older versions of this topic are never used again.
                s.cache.retain(|(id, v), _| *id != t.id || *v >= version);
                if s.cache.len() >= VALIDATORS_CACHED_MAX {
                    if let Some(oldest) =
                        s.cache.iter().min_by_key(|(_, c)| c.used).map(|(k, _)| *k)
                    {
                        s.cache.remove(&oldest);
                    }
                }
                let used = s.tick;
                s.cache.insert(
                    key,
                    Cached {
                        compiled: c.clone(),
                        used,
                    },
                );
            });
            c
        }
    };
    match compiled {
        Ok(c) => Ok(Some(c)),
        Err(e) => {
            tracing::error!(topic = %t.name, version, error = %e, "stored schema does not compile");
            Err(Rejection {
                kind: RejectionKind::Uncompilable,
                message: format!("schema: version {version} cannot be compiled by this build"),
            })
        }
    }
}

/// Validates one produce body against `t`'s current schema, if it has one (SEMANTICS.md §8.1).
pub async fn check_produce(t: &TopicMeta, payload: &[u8]) -> Result<(), Rejection> {
    match for_topic(t)? {
        Some(c) => c.check(payload).await,
        None => Ok(()),
    }
}

/// Validators cached on this shard (for tests and metrics).
pub fn cached_validators() -> usize {
    SHARD.with(|s| s.borrow().cache.len())
}

fn shard_slot() -> Semaphore {
    SHARD.with(|s| {
        s.borrow_mut()
            .slot
            .get_or_insert_with(|| Semaphore::new(1))
            .clone()
    })
}

async fn acquire_slot(wait: Duration) -> Result<SemaphorePermit, Rejection> {
    let sem = shard_slot();
    if let Some(p) = sem.try_acquire() {
        return Ok(p);
    }
    match narad_io::rt::timeout(wait, sem.acquire()).await {
        Ok(p) => Ok(p),
        Err(_) => {
            count(|c| c.rejected_busy += 1);
            Err(Rejection {
                kind: RejectionKind::Busy,
                message: BUSY_MESSAGE.into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn compiled(doc: Value) -> Compiled {
        check_document(&doc).unwrap();
        Compiled::new("payments", 1, &doc).unwrap()
    }

    #[test]
    fn rejection_texts_follow_section_8_2() {
        // Proves the exact report for a missing property and a wrong type, with the pointer.
        let c = compiled(json!({"type":"object","required":["id"],
            "properties":{"id":{"type":"string"},"amount":{"type":"integer"}}}));
        assert!(c.check_now(br#"{"id":"a","amount":3}"#).is_ok());
        assert_eq!(
            c.check_now(br#"{"amount":3}"#).unwrap_err().message,
            "invalid argument: schema: jsonschema validation failed with 'narad://schema/payments/1#'\n- at '': missing property 'id'"
        );
        assert_eq!(
            c.check_now(br#"{"id":"a","amount":"x"}"#).unwrap_err().message,
            "invalid argument: schema: jsonschema validation failed with 'narad://schema/payments/1#'\n- at '/amount': got string, want integer"
        );
        let r = c.check_now(b"not json").unwrap_err();
        assert_eq!(r.kind, RejectionKind::Invalid);
        assert!(r
            .message
            .starts_with("invalid argument: schema: payload is not one valid JSON text"));
        let deep = format!("{}{}", "[".repeat(300), "]".repeat(300));
        assert_eq!(
            c.check_now(deep.as_bytes()).unwrap_err().message,
            TOO_DEEP_MESSAGE
        );
        assert_eq!(
            c.check_now(b"{}").unwrap_err().at(3).message.lines().next().unwrap(),
            "message 3: invalid argument: schema: jsonschema validation failed with 'narad://schema/payments/1#'"
        );
    }

    #[test]
    fn reports_are_bounded() {
        // Proves a payload with thousands of errors yields a report of at most 2 KiB.
        let c = compiled(json!({"type":"array","items":{"type":"string","minLength":5}}));
        let payload = serde_json::to_vec(&vec![1; 5000]).unwrap();
        let m = c.check_now(&payload).unwrap_err().message;
        assert!(m.len() <= REJECTION_BYTES_MAX, "{}", m.len());
        assert!(m.contains("- at '/0': got integer, want string"));
    }

    #[test]
    fn validator_rules_of_section_8_3() {
        // Proves: 2020-12 by default and older drafts by $schema; formats asserted; maxLength in
        // characters; 1.0 is an integer; duplicate keys validate the last value.
        let c = compiled(
            json!({"properties":{"e":{"format":"email"},"n":{"maxLength":2},
            "i":{"type":"integer"}},"prefixItems":[{"type":"string"}]}),
        );
        assert!(c.check_now(br#"{"e":"a@b.example"}"#).is_ok());
        assert!(c.check_now(br#"{"e":"nope"}"#).is_err());
        assert!(c.check_now("{\"n\":\"éé\"}".as_bytes()).is_ok());
        assert!(c.check_now(br#"{"i":1.0}"#).is_ok());
        assert!(c.check_now(br#"{"i":1.5}"#).is_err());
        assert!(c.check_now(br#"{"i":"x","i":2}"#).is_ok());
        let d7 = compiled(json!({"$schema":"http://json-schema.org/draft-07/schema#",
            "items":[{"type":"string"}]}));
        assert!(d7.check_now(br#"[1]"#).is_err());
        let d4 = compiled(json!({"$schema":"http://json-schema.org/draft-04/schema#",
            "maximum":3,"exclusiveMaximum":true}));
        assert!(d4.check_now(b"3").is_err());
        assert!(compiled(json!({"format":"x-unknown"}))
            .check_now(b"1")
            .is_ok());
    }

    #[test]
    fn registration_refusals() {
        // Proves the §8.4 document rules: shape, size, nesting, references, patterns.
        for bad in [json!(false), json!(null), json!([]), json!("s"), json!(1)] {
            assert!(check_document(&bad).is_err(), "{bad}");
        }
        assert!(check_document(&json!(true)).is_ok());
        let big = json!({"description": "x".repeat(SCHEMA_BYTES_MAX)});
        assert!(check_document(&big).unwrap_err().0.contains("bytes"));
        let mut deep = json!({});
        for _ in 0..SCHEMA_NESTING_MAX {
            deep = json!({ "not": deep });
        }
        assert!(check_document(&deep)
            .unwrap_err()
            .0
            .contains("nests deeper"));
        for r in [
            "http://example.com/s.json",
            "other.json",
            "file:///etc/passwd",
        ] {
            let e = check_document(&json!({"$ref": r})).unwrap_err();
            assert!(e.0.contains("outside the document"), "{e}");
        }
        assert!(check_document(&json!({"$defs":{"a":{}},"$ref":"#/$defs/a"})).is_ok());
        assert!(check_document(&json!({"$ref":"#/$defs/missing"})).is_err());
        let before = counters();
        assert!(check_document(&json!({"pattern":"(?=a)"})).is_err());
        assert!(check_document(&json!({"pattern":"(a)\\1"})).is_err());
        assert!(check_document(&json!({"pattern":"^[a-z]+$"})).is_ok());
        assert!(check_document(&json!({"pattern":"(\\w{1000}){1000}"})).is_err());
        assert!(check_document(&json!({"patternProperties":{"(?<=x)":{}}})).is_err());
        assert!(check_document(&json!({"type": 5})).is_err());
        let cycle = json!({"$defs":{"a":{"not":{"$ref":"#/$defs/a"}}},"$ref":"#/$defs/a"});
        assert!(check_document(&cycle).unwrap_err().0.contains("cycle"));
        // The four refused patterns count as `definition_pattern`, the cycle as
        // `definition_paths`; the bad `type` counts as neither (OPERATIONS.md §9.3).
        let after = counters();
        assert_eq!(
            after.rejected_definition_pattern - before.rejected_definition_pattern,
            4
        );
        assert_eq!(
            after.rejected_definition_paths - before.rejected_definition_paths,
            1
        );
        assert!(check_document(&json!({"$schema":"http://example.com/custom"})).is_err());
    }

    #[test]
    fn annotation_only_changes_are_the_same_schema() {
        // Proves the idempotent re-register rule ignores annotations but not constraints.
        let a = json!({"type":"object","properties":{"id":{"type":"string"}}});
        let b = json!({"title":"T","type":"object","properties":{"id":{"type":"string","examples":["x"]}}});
        assert!(same_ignoring_annotations(&a, &b));
        let c = json!({"type":"object","properties":{"id":{"type":"integer"}}});
        assert!(!same_ignoring_annotations(&a, &c));
    }

    #[test]
    fn cache_compiles_once_per_version() {
        // Proves the shard cache is keyed by (topic id, version) and drops older versions.
        let mut t = TopicMeta {
            name: "t".into(),
            id: TopicId(7),
            partitions: 3,
            retention_ms: 0,
            visibility_timeout_ms: 1,
            max_in_flight_per_partition: 1,
            max_acked_ahead_per_partition: 1,
            created_at_s: 0,
            owner: None,
            schemas: vec![json!({"type":"string"})],
            parent: None,
            children: vec![],
            attach_epoch: None,
            fanout_delay_ms: 0,
            attach_offsets: vec![],
            owners: Vec::new(),
            moves: Default::default(),
            remote: None,
        };
        let a = for_topic(&t).unwrap().unwrap();
        let b = for_topic(&t).unwrap().unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        let before = cached_validators();
        t.schemas.push(json!({"type":["string","integer"]}));
        let c = for_topic(&t).unwrap().unwrap();
        assert_eq!(c.version(), 2);
        assert_eq!(cached_validators(), before);
        t.schemas.clear();
        assert!(for_topic(&t).unwrap().is_none());
    }

    #[test]
    fn cache_is_bounded() {
        // Proves VALIDATORS_CACHED_MAX: validators of more topics than the bound evict the least
        // recently used, and the one in use stays.
        let topic = |i: u64| TopicMeta {
            name: format!("t{i}"),
            id: TopicId(1_000 + i),
            partitions: 3,
            retention_ms: 0,
            visibility_timeout_ms: 1,
            max_in_flight_per_partition: 1,
            max_acked_ahead_per_partition: 1,
            created_at_s: 0,
            owner: None,
            schemas: vec![json!({"type": "integer"})],
            parent: None,
            children: vec![],
            attach_epoch: None,
            fanout_delay_ms: 0,
            attach_offsets: vec![],
            owners: Vec::new(),
            moves: Default::default(),
            remote: None,
        };
        let hot = topic(0);
        let first = for_topic(&hot).unwrap().unwrap();
        for i in 1..(VALIDATORS_CACHED_MAX as u64 + 50) {
            for_topic(&topic(i)).unwrap();
            for_topic(&hot).unwrap();
        }
        assert!(cached_validators() <= VALIDATORS_CACHED_MAX);
        assert!(Arc::ptr_eq(&first, &for_topic(&hot).unwrap().unwrap()));
    }

    #[test]
    fn busy_slot_answers_503() {
        // Proves a large payload waiting longer than its bound for the shard's slot gets a 503
        // whose text holds both API.md §10.1's wording and the `schema validation slot` the Go
        // SDK matches (CLIENTS.md), and gets through once the slot is free.
        narad_io::rt::block_on(async {
            let c = Arc::new(compiled(json!({"type":"string"})));
            let big = serde_json::to_vec(&"x".repeat(SLOT_PAYLOAD_BYTES_MIN + 1)).unwrap();
            let held = acquire_slot(SLOT_WAIT).await.unwrap();
            let r = c
                .check_within(&big, Duration::from_millis(20))
                .await
                .unwrap_err();
            assert_eq!(
                (r.kind, r.message.as_str()),
                (RejectionKind::Busy, BUSY_MESSAGE)
            );
            assert!(
                r.message
                    .contains("schema: validation capacity busy, retry")
                    && r.message.contains("schema validation slot"),
                "{}",
                r.message
            );
            // The batch form keeps both texts after its `message <i>: ` prefix.
            let b = r.clone().at(3);
            assert!(
                b.message.contains("schema validation slot"),
                "{}",
                b.message
            );
            // Small payloads on a cheap schema never wait for the slot.
            assert!(c
                .check_within(b"\"s\"", Duration::from_millis(20))
                .await
                .is_ok());
            drop(held);
            assert!(c
                .check_within(&big, Duration::from_millis(20))
                .await
                .is_ok());
        });
    }
}
