//! The scenario's `envoy:` section: what the Envoy in front of the fleet does with a decision
//! that is slow or fails, as its `ratelimit` filter's `timeout` and `failure_mode_deny` say.
//!
//! Flow: [`envoy`] reads the two fields (both optional: Envoy's defaults, 20 ms and `false`)
//! → an [`EnvoyModel`] → `arrivals.rs` gives each decision that waits on the store until
//! `timeout_ms` (Envoy resets the call; tonic drops the decision, as in `serve`) and each
//! request tollgate answers with an error to the failure mode: admitted, or refused with
//! `failure_mode_deny: true`.

use crate::rules::error::Problems;
use crate::rules::yaml::{self, Node};

/// Envoy's default `timeout` of the `ratelimit` filter's RLS call.
pub const DEFAULT_TIMEOUT_MS: u64 = 20;

/// The most a scenario may give Envoy's call (an hour: past it, `0` says "never").
const MAX_TIMEOUT_MS: u64 = 3_600_000;

/// How Envoy treats the fleet's answers.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EnvoyModel {
    /// How long Envoy waits for a decision; `None`: for ever (a client without a deadline).
    pub timeout_ms: Option<u64>,
    /// `true`: a request whose decision timed out or failed is refused; `false` (Envoy's
    /// default): it is admitted.
    pub failure_mode_deny: bool,
}

impl Default for EnvoyModel {
    fn default() -> Self {
        EnvoyModel {
            timeout_ms: Some(DEFAULT_TIMEOUT_MS),
            failure_mode_deny: false,
        }
    }
}

/// Reads `envoy:` (`timeout_ms: 0` means Envoy never gives up).
pub(super) fn envoy(out: &mut Problems, node: &Node) -> Option<EnvoyModel> {
    if node.is_null() {
        return Some(EnvoyModel::default());
    }
    let f = yaml::fields(out, node, "envoy", &["timeout_ms", "failure_mode_deny"])?;
    // Both read before either can stop the walk: every problem is reported.
    let timeout_ms = match f.get("timeout_ms") {
        Some(n) => yaml::uint(out, n, "envoy.timeout_ms", MAX_TIMEOUT_MS)
            .map(|ms| Some(ms).filter(|&ms| ms > 0)),
        None => Some(Some(DEFAULT_TIMEOUT_MS)),
    };
    let failure_mode_deny = match f.get("failure_mode_deny") {
        Some(n) => yaml::bool(out, n, "envoy.failure_mode_deny"),
        None => Some(false),
    };
    Some(EnvoyModel {
        timeout_ms: timeout_ms?,
        failure_mode_deny: failure_mode_deny?,
    })
}
