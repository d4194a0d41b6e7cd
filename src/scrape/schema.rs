//! §9.3 schema validation: how long validations under the slot took, how many ran and run
//! now, and the produces and schema documents refused, by reason.
//!
//! Owns the rendering of those families from the merged figures; never reads the node.

use super::Merged;
use crate::metrics::expo::{Expo, Kind};

/// Every §9.3 family.
pub(super) fn render(e: &mut Expo, m: &Merged) {
    e.family(
        "narad_schema_validation_seconds",
        Kind::Histogram,
        "Time of each validation run under the validation slot (payloads over 16 KiB, costly \
         schemas), decoding included, the wait for the slot excluded; others are not timed.",
    );
    e.histogram(
        "narad_schema_validation_seconds",
        &[],
        &m.schema_seconds,
        1e6,
    );
    e.family(
        "narad_schema_validations_total",
        Kind::Counter,
        "Produce payloads validated against a topic schema.",
    );
    e.int("narad_schema_validations_total", &[], m.schema.validations);
    e.family(
        "narad_schema_validations_in_flight",
        Kind::Gauge,
        "Payload validations running now.",
    );
    e.int(
        "narad_schema_validations_in_flight",
        &[],
        m.schema.in_flight,
    );
    e.family(
        "narad_schema_rejections_total",
        Kind::Counter,
        "Produces refused by schema validation, by reason.",
    );
    for (reason, n) in [
        ("depth", m.schema.rejected_depth),
        ("malformed", m.schema.rejected_malformed),
        ("invalid", m.schema.rejected_invalid),
        ("busy", m.schema.rejected_busy),
        // A produce is not cancelled while it validates: the answer is computed even when the
        // client has gone (only long-polls notice a departed client).
        ("canceled", 0),
        ("definition_paths", m.schema.rejected_definition_paths),
        ("definition_pattern", m.schema.rejected_definition_pattern),
    ] {
        e.int("narad_schema_rejections_total", &[("reason", reason)], n);
    }
}
