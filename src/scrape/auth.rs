//! §9.6 authentication: password verifications waiting or running.
//!
//! Owns the rendering of that family from the node's facts; never reads the node.

use super::NodeFacts;
use crate::metrics::expo::{Expo, Kind};

/// `narad_auth_verify_queued`.
pub(super) fn render(e: &mut Expo, facts: &NodeFacts) {
    e.family(
        "narad_auth_verify_queued",
        Kind::Gauge,
        "Password verifications waiting or running on the helper threads.",
    );
    e.int("narad_auth_verify_queued", &[], facts.auth_verify_queued);
}
