//! Structured logs (OPERATIONS.md §8): one line per event on stderr, JSON lines by default
//! (`log.format=json`: `{"time":…,"level":"INFO","msg":"http listening",…}`, the `msg` key the
//! spec names) or text for humans (`log.format=text`, the `--dev` default).
//!
//! Owns: the event format of both modes and the request id on the log lines of a request. A
//! request id is set for the duration of each poll of the request's handler ([`with_request_id`])
//! in a thread-local cell (one executor per thread, so the cell is exactly the running task's);
//! the formatter adds it to every line written meanwhile. This costs two `Cell` writes per poll,
//! where a `tracing` span per request would cost an allocation in the span registry. Requests
//! are numbered by the shard that accepted them (see `metrics::observe`); the API spec names no
//! request-id header, so none is read from clients nor echoed.
//!
//! Every line ends with the emitting module as `target`, except a line whose event has its own
//! `target` field: an audit line, where `target` is the audited object (SEMANTICS.md §15). The
//! module is left out there, so that no line carries the key twice.
//!
//! Never logs a request body, credentials or 4xx answers (§8); never blocks on anything but
//! stderr.

use std::cell::Cell;
use std::fmt::Write as _;
use std::future::Future;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

thread_local! {
    static REQUEST_ID: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Restores the previous request id when dropped (also when the handler panics).
struct Scope(Option<u64>);

impl Scope {
    fn enter(id: u64) -> Scope {
        Scope(REQUEST_ID.with(|c| c.replace(Some(id))))
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        REQUEST_ID.with(|c| c.set(self.0));
    }
}

/// Runs `f`, tagging every log line it writes with request id `id`.
pub async fn with_request_id<F: Future>(id: u64, f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    std::future::poll_fn(|cx| {
        let _scope = Scope::enter(id);
        f.as_mut().poll(cx)
    })
    .await
}

/// Runs `f` (synchronous) with request id `id` on its log lines.
pub fn in_request<R>(id: u64, f: impl FnOnce() -> R) -> R {
    let _scope = Scope::enter(id);
    f()
}

/// The request id of the running request, if any.
pub fn current_request_id() -> Option<u64> {
    REQUEST_ID.with(Cell::get)
}

/// A request id as it appears in logs: 16 hex digits.
pub fn format_request_id(id: u64) -> String {
    format!("{id:016x}")
}

/// Installs the process's subscriber: `level` (`debug`, `info`, `warn`, `error`) unless the
/// `NARAD_LOG` environment variable holds a full filter, `format` `json` or `text`. A second call
/// does nothing.
pub fn init(level: &str, format: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("NARAD_LOG").unwrap_or_else(|_| {
        // openraft narrates every election at info; keep it to warnings unless asked.
        tracing_subscriber::EnvFilter::new(format!("{level},openraft=warn"))
    });
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .event_format(LineFormat {
            json: format == "json",
        })
        .try_init();
}

/// The event format of both modes.
pub struct LineFormat {
    pub json: bool,
}

/// An event's fields in the order written: the message apart, the others as (name, value).
#[derive(Default)]
struct Fields {
    msg: String,
    rest: Vec<(&'static str, Value)>,
}

impl Fields {
    /// True when the event names its own `target` (an audit line's audited object): the
    /// logger's module target is then left out, because JSON and logfmt readers keep the last of
    /// two equal keys and would lose the event's (SEMANTICS.md §15).
    fn has_target(&self) -> bool {
        self.rest.iter().any(|(k, _)| *k == "target")
    }
}

enum Value {
    Str(String),
    Int(i128),
    Float(f64),
    Bool(bool),
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.msg.push_str(value);
        } else {
            self.rest
                .push((field.name(), Value::Str(value.to_string())));
        }
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.rest.push((field.name(), Value::Int(value.into())));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.rest.push((field.name(), Value::Int(value.into())));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.rest.push((field.name(), Value::Int(value)));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        match i128::try_from(value) {
            Ok(v) => self.rest.push((field.name(), Value::Int(v))),
            Err(_) => self
                .rest
                .push((field.name(), Value::Str(value.to_string()))),
        }
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.rest.push((field.name(), Value::Float(value)));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.rest.push((field.name(), Value::Bool(value)));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let s = format!("{value:?}");
        if field.name() == "message" {
            self.msg.push_str(&s);
        } else {
            self.rest.push((field.name(), Value::Str(s)));
        }
    }
}

/// glommio's warning when io_uring refuses to register a shard's I/O buffers is a Rust debug
/// dump (`Error: registering buffers in the poll ring. SkippingOs {\n    code: 12, ...`). It
/// comes at every start of a non-root broker whose locked-memory limit is a few MiB (each
/// registration is charged as a 2 MiB huge page, three rings per shard): say what it means.
fn explain_runtime_warning(f: &mut Fields) {
    if !f.msg.starts_with("Error: registering buffers")
        || !f.rest.iter().any(|(k, v)| {
            *k == "log.target" && matches!(v, Value::Str(t) if t == narad_io::rt::URING_LOG_TARGET)
        })
    {
        return;
    }
    let cause = if f.msg.contains("OutOfMemory") {
        "the locked-memory limit (ulimit -l) is too low for them"
    } else {
        "io_uring refused them"
    };
    f.msg = format!(
        "io_uring buffer registration skipped on this shard ({cause}): it runs without \
         registered I/O buffers, at a little more CPU per read and write; raise the memlock limit \
         (ulimit -l, the container's memlock ulimit) to avoid it"
    );
}

fn level_name(l: &Level) -> &'static str {
    match *l {
        Level::ERROR => "ERROR",
        Level::WARN => "WARN",
        Level::INFO => "INFO",
        Level::DEBUG => "DEBUG",
        Level::TRACE => "TRACE",
    }
}

/// A JSON string literal (quotes included).
fn json_str(out: &mut String, s: &str) {
    out.push_str(&serde_json::to_string(s).unwrap_or_else(|_| "\"\"".into()));
}

/// A text value: bare when it has no spaces, quotes or `=`, else quoted like a JSON string.
fn text_value(out: &mut String, s: &str) {
    if !s.is_empty()
        && !s
            .chars()
            .any(|c| c.is_whitespace() || c == '"' || c == '=' || c.is_control())
    {
        out.push_str(s);
    } else {
        json_str(out, s);
    }
}

impl LineFormat {
    /// One line for an event with these parts (no trailing newline).
    fn line(
        &self,
        time: &str,
        level: &Level,
        target: &str,
        f: &Fields,
        rid: Option<u64>,
    ) -> String {
        let mut out = String::with_capacity(128 + f.msg.len());
        if self.json {
            out.push_str("{\"time\":");
            json_str(&mut out, time);
            let _ = write!(out, ",\"level\":\"{}\",\"msg\":", level_name(level));
            json_str(&mut out, &f.msg);
            for (k, v) in &f.rest {
                out.push(',');
                json_str(&mut out, k);
                out.push(':');
                match v {
                    Value::Str(s) => json_str(&mut out, s),
                    Value::Int(i) => {
                        let _ = write!(out, "{i}");
                    }
                    Value::Float(x) if x.is_finite() => {
                        let _ = write!(out, "{x}");
                    }
                    Value::Float(x) => json_str(&mut out, &x.to_string()),
                    Value::Bool(b) => {
                        let _ = write!(out, "{b}");
                    }
                }
            }
            if let Some(id) = rid {
                let _ = write!(out, ",\"request_id\":\"{}\"", format_request_id(id));
            }
            if !f.has_target() {
                out.push_str(",\"target\":");
                json_str(&mut out, target);
            }
            out.push('}');
        } else {
            let _ = write!(out, "{time} {:<5} {}", level_name(level), f.msg);
            for (k, v) in &f.rest {
                let _ = write!(out, " {k}=");
                match v {
                    Value::Str(s) => text_value(&mut out, s),
                    Value::Int(i) => {
                        let _ = write!(out, "{i}");
                    }
                    Value::Float(x) => {
                        let _ = write!(out, "{x}");
                    }
                    Value::Bool(b) => {
                        let _ = write!(out, "{b}");
                    }
                }
            }
            if let Some(id) = rid {
                let _ = write!(out, " request_id={}", format_request_id(id));
            }
            if !f.has_target() {
                let _ = write!(out, " target={target}");
            }
        }
        out
    }
}

impl<S, N> FormatEvent<S, N> for LineFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut f = Fields::default();
        event.record(&mut f);
        explain_runtime_warning(&mut f);
        let meta = event.metadata();
        let line = self.line(
            &rfc3339_now(),
            meta.level(),
            meta.target(),
            &f,
            current_request_id(),
        );
        writeln!(writer, "{line}")
    }
}

/// The current UTC time as RFC 3339 with milliseconds (`2026-11-29T12:00:00.123Z`).
pub fn rfc3339_now() -> String {
    let d = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    rfc3339(d.as_secs() as i64, d.subsec_millis())
}

/// RFC 3339 with milliseconds in UTC from Unix milliseconds.
pub fn rfc3339_ms(ms: u64) -> String {
    rfc3339((ms / 1000) as i64, (ms % 1000) as u32)
}

/// RFC 3339 in UTC from Unix seconds (the civil-from-days algorithm of H. Hinnant).
fn rfc3339(secs: i64, millis: u32) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (year, month, day) = crate::wire::civil::civil_from_days(days);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        sod / 3600,
        sod % 3600 / 60,
        sod % 60
    )
}

/// Writes an audit line for a user or grant change (SEMANTICS.md §15).
pub fn audit(event: &str, actor: &str, target: &str, status: u16, outcome: &str) {
    tracing::info!(
        component = "audit",
        event,
        actor,
        target,
        status,
        outcome,
        "audit"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_matches_known_instants() {
        // Proves the calendar conversion at the epoch, a leap day and a far date.
        assert_eq!(rfc3339(0, 0), "1970-01-01T00:00:00.000Z");
        assert_eq!(rfc3339(951_782_400, 5), "2000-02-29T00:00:00.005Z");
        assert_eq!(rfc3339(1_795_954_103, 999), "2026-11-29T12:08:23.999Z");
    }

    #[test]
    fn glommio_buffer_registration_warning_is_explained() {
        // Proves glommio's debug-dump warning becomes one plain sentence naming the cause, and
        // that other glommio lines and other messages are left as they are.
        let uring = |msg: &str| Fields {
            msg: msg.into(),
            rest: vec![(
                "log.target",
                Value::Str(narad_io::rt::URING_LOG_TARGET.into()),
            )],
        };
        let mut f = uring(
            "Error: registering buffers in the poll ring. SkippingOs {\n    code: 12,\n    \
             kind: OutOfMemory,\n    message: \"Cannot allocate memory\",\n}",
        );
        explain_runtime_warning(&mut f);
        assert!(
            f.msg.starts_with(
                "io_uring buffer registration skipped on this shard (the \
             locked-memory limit (ulimit -l) is too low for them)"
            ),
            "{}",
            f.msg
        );
        assert!(!f.msg.contains('\n'));
        let mut other = uring("Error: something else");
        explain_runtime_warning(&mut other);
        assert_eq!(other.msg, "Error: something else");
        let mut ours = Fields {
            msg: "Error: registering buffers".into(),
            rest: vec![],
        };
        explain_runtime_warning(&mut ours);
        assert_eq!(ours.msg, "Error: registering buffers");
    }

    #[test]
    fn json_line_has_msg_fields_and_request_id() {
        // Proves a JSON line parses as one object with time, level, msg (the spec's key), the
        // event's fields with their types, the request id and the target; odd strings escaped.
        let f = Fields {
            msg: "http listening".into(),
            rest: vec![
                ("addr", Value::Str("127.0.0.1:7942 \"x\"\n".into())),
                ("shards", Value::Int(2)),
                ("ok", Value::Bool(true)),
                ("ms", Value::Float(1.5)),
            ],
        };
        let l = LineFormat { json: true }.line(
            "2026-11-29T12:00:00.000Z",
            &Level::INFO,
            "narad::server",
            &f,
            Some(0x0100_0000_0000_002a),
        );
        let v: serde_json::Value = serde_json::from_str(&l).unwrap();
        assert_eq!(v["msg"], "http listening");
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["time"], "2026-11-29T12:00:00.000Z");
        assert_eq!(v["addr"], "127.0.0.1:7942 \"x\"\n");
        assert_eq!(v["shards"], 2);
        assert_eq!(v["ok"], true);
        assert_eq!(v["ms"], 1.5);
        assert_eq!(v["request_id"], "010000000000002a");
        assert_eq!(v["target"], "narad::server");
        assert!(!l.contains('\n'));
        let t = LineFormat { json: false }.line(
            "2026-11-29T12:00:00.000Z",
            &Level::WARN,
            "x",
            &f,
            None,
        );
        assert!(t.starts_with("2026-11-29T12:00:00.000Z WARN  http listening addr="));
        assert!(t.contains(" shards=2 ok=true"));
        assert!(!t.contains('\n'));
    }

    #[test]
    fn audit_line_target_is_the_audited_object() {
        // Proves an audit line, written through the real subscriber and formatter, parses as
        // JSON with `target` = the audited user (SEMANTICS.md §15), and carries the key once: a
        // second, module `target` would win in JSON readers that keep the last duplicate. The
        // text form likewise has one `target=`.
        use std::sync::{Arc, Mutex};

        #[derive(Clone, Default)]
        struct Buf(Arc<Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let lines = |json: bool| {
            let buf = Buf::default();
            let out = buf.clone();
            let sub = tracing_subscriber::fmt()
                .with_writer(move || out.clone())
                .event_format(LineFormat { json })
                .finish();
            tracing::subscriber::with_default(sub, || {
                super::audit("user.create", "admin", "bob", 201, "ok");
                tracing::info!(shards = 2, "http listening");
            });
            let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
            text.lines().map(String::from).collect::<Vec<_>>()
        };

        let json = lines(true);
        assert_eq!(json.len(), 2, "{json:?}");
        let audit = &json[0];
        let v: serde_json::Value = serde_json::from_str(audit).unwrap();
        assert_eq!(v["component"], "audit", "{audit}");
        assert_eq!(v["event"], "user.create");
        assert_eq!(v["actor"], "admin");
        assert_eq!(v["target"], "bob", "{audit}");
        assert_eq!(audit.matches("\"target\":").count(), 1, "{audit}");
        // Lines without their own target keep the module.
        let v: serde_json::Value = serde_json::from_str(&json[1]).unwrap();
        assert_eq!(v["target"], "narad::logging::tests", "{}", json[1]);

        let text = lines(false);
        assert_eq!(text[0].matches(" target=").count(), 1, "{}", text[0]);
        assert!(text[0].contains(" target=bob "), "{}", text[0]);
        assert!(
            text[1].ends_with(" target=narad::logging::tests"),
            "{}",
            text[1]
        );
    }

    #[test]
    fn request_id_scope_restores_previous() {
        // Proves the id is visible inside the scope only and nesting restores the outer one.
        assert_eq!(current_request_id(), None);
        in_request(1, || {
            assert_eq!(current_request_id(), Some(1));
            in_request(2, || assert_eq!(current_request_id(), Some(2)));
            assert_eq!(current_request_id(), Some(1));
        });
        assert_eq!(current_request_id(), None);
    }
}
