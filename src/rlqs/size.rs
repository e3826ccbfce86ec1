//! How many tokens one Envoy's next assignment asks the shared bucket for: its share of what
//! the bucket can give over one report interval, weighted by its reported demand against the
//! other Envoys' on the same bucket, with a floor so a new or quiet Envoy is not starved, and
//! never more than its own demand (plus headroom) so it does not hoard what others need.

use crate::store::OpKind;

/// An Envoy's assignment covers its demand of the last interval times this, so a modest rise
/// in traffic does not run it dry before its next report.
pub const HEADROOM: f64 = 1.25;

/// What the bucket can give over the next `interval_ms`: what it held at the last claim plus
/// what refills meanwhile (a token bucket), or what is left of the window (a fixed window).
/// At least 1, so a claim is always worth asking: the store says when it cannot fit.
pub fn supply(kind: OpKind, remaining: u64, interval_ms: u64) -> u64 {
    match kind {
        OpKind::TokenBucket {
            capacity,
            refill,
            window_ms,
        } => {
            let refilled =
                u128::from(refill) * u128::from(interval_ms) / u128::from(window_ms.max(1));
            let refilled = u64::try_from(refilled).unwrap_or(u64::MAX);
            remaining.min(capacity).saturating_add(refilled).max(1)
        }
        OpKind::FixedWindow { .. } | OpKind::SlidingWindow { .. } | OpKind::SlidingLog { .. } => {
            remaining.max(1)
        }
    }
}

/// The tokens one Envoy asks for. `own`: its demand in requests per second (allowed + denied
/// over the last report's span), `None` before it has reported a span (its first report);
/// `others`: the demand of the other Envoys on this bucket that this replica serves; `supply`
/// from [`supply`].
///
/// Its weight is its share of the demand, at least `1 / (2 n)` of the supply with `n` Envoys
/// (the floor); an Envoy whose demand is not known yet gets the floor. It asks for its weight
/// of the supply, but no more than its demand over the interval times [`HEADROOM`].
pub fn want(own: Option<f64>, others: &[f64], supply: u64, interval_ms: u64) -> u64 {
    let n = (others.len() + 1) as f64;
    let floor = 1.0 / (2.0 * n);
    let total: f64 = own.unwrap_or(0.0) + others.iter().sum::<f64>();
    let weight = match own {
        Some(r) if total > 0.0 => (r / total).max(floor),
        _ => floor,
    };
    let fair = (weight * supply as f64).ceil();
    let want = match own {
        Some(r) => fair.min((r * interval_ms as f64 / 1000.0 * HEADROOM).ceil()),
        None => fair,
    };
    // Saturating float → int: a NaN (no demand at all) asks for 1.
    (want as u64).clamp(1, supply.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    const TB: OpKind = OpKind::TokenBucket {
        capacity: 100,
        refill: 60,
        window_ms: 60_000,
    };

    #[test]
    fn supply_is_what_is_left_plus_one_interval_of_refill() {
        assert_eq!(supply(TB, 40, 5_000), 45);
        assert_eq!(supply(TB, 0, 5_000), 5);
        assert_eq!(
            supply(TB, 500, 5_000),
            105,
            "remaining is capped at the capacity"
        );
        let fw = OpKind::FixedWindow {
            limit: 10,
            window_ms: 60_000,
        };
        assert_eq!(supply(fw, 7, 5_000), 7);
        assert_eq!(supply(fw, 0, 5_000), 1, "always worth one claim");
    }

    #[test]
    fn shares_follow_demand_with_a_floor() {
        // One Envoy asks four times what the other does: 80 % of a scarce supply, and the
        // other the floor of 1/(2n) = 25 % (above its 20 %); the store's claims run one after
        // the other, so the later one gets what is left.
        assert_eq!(want(Some(40.0), &[10.0], 100, 5_000), 80);
        assert_eq!(want(Some(10.0), &[40.0], 100, 5_000), 25);
        assert_eq!(
            want(Some(10.0), &[40.0, 40.0, 40.0], 100, 5_000),
            13,
            "1/8 floor"
        );
        // A quiet Envoy still gets the floor: 1/(2n) of the supply.
        assert_eq!(
            want(Some(0.1), &[100.0], 100, 5_000),
            1,
            "capped by its own demand"
        );
        assert_eq!(
            want(Some(1.0), &[1_000.0], 100, 5_000),
            7,
            "ceil(1 × 5 × 1.25)"
        );
        assert_eq!(
            want(Some(100.0), &[100_000.0], 100, 5_000),
            25,
            "the floor: 100/4"
        );
        // A new Envoy (no span reported yet) gets the floor.
        assert_eq!(want(None, &[], 100, 5_000), 50);
        assert_eq!(want(None, &[30.0, 30.0], 90, 5_000), 15);
    }

    #[test]
    fn an_envoy_never_asks_beyond_its_demand_or_the_supply() {
        assert_eq!(want(Some(2.0), &[], 100, 5_000), 13, "ceil(2 × 5 × 1.25)");
        assert_eq!(want(Some(1e9), &[], 100, 5_000), 100);
        assert_eq!(want(Some(0.0), &[], 100, 5_000), 1, "no demand: one token");
        assert_eq!(want(Some(0.0), &[0.0], 100, 5_000), 1);
    }
}
