//! How many tokens one Envoy's next assignment asks the shared bucket for: its share of what
//! the bucket can give over one report interval, weighted by its reported demand against the
//! other Envoys' on the same bucket, with a floor so a new or quiet Envoy is not starved, and
//! never more than its own demand (plus headroom) so it does not hoard what others need.

use crate::quota::OpKind;

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
        OpKind::FixedWindow { .. }
        | OpKind::SlidingWindow { .. }
        | OpKind::SlidingLog { .. }
        | OpKind::CalendarWindow { .. } => remaining.max(1),
    }
}

/// What the limit itself refills over one report interval (a token bucket's refill, a fixed
/// window's limit, over the interval's share of the window), at least 1: the most an Envoy is
/// granted beyond its measured demand, and a new Envoy's first claim ([`want`]).
pub fn refill_per_interval(kind: OpKind, interval_ms: u64) -> u64 {
    let (per_window, window_ms) = kind.per_window();
    let n =
        (u128::from(per_window) * u128::from(interval_ms)).div_ceil(u128::from(window_ms.max(1)));
    u64::try_from(n).unwrap_or(u64::MAX).max(1)
}

/// The tokens one Envoy asks for. `own`: its demand in requests per second (allowed + denied
/// over the last report's span), `None` before it has reported a span (its first report);
/// `others`: the demand of the other Envoys on this bucket that this replica serves; `supply`
/// from [`supply`]; `ramp` from [`refill_per_interval`].
///
/// Its weight is its share of the demand, at least `1 / (2 n)` of the supply with `n` Envoys
/// (the floor). It asks for its weight of the supply (`fair`), but no more than:
/// - its demand over the interval times [`HEADROOM`], or, if more, what the bucket can spare
///   beyond the other Envoys' demand up to `ramp`: demand may grow at once, by up to what the
///   limit refills in an interval, where the bucket has the tokens;
/// - before its demand is known (a new bucket, or a new stream), `ramp`: not half the bucket,
///   which a stream that reports once and goes would take with it.
///
/// So what a stream that breaks keeps is at most its demand × 1.25 or the limit's refill over
/// one interval, whichever is more.
pub fn want(own: Option<f64>, others: &[f64], supply: u64, interval_ms: u64, ramp: u64) -> u64 {
    let n = (others.len() + 1) as f64;
    let floor = 1.0 / (2.0 * n);
    let total: f64 = own.unwrap_or(0.0) + others.iter().sum::<f64>();
    let weight = match own {
        Some(r) if total > 0.0 => (r / total).max(floor),
        _ => floor,
    };
    let fair = (weight * supply as f64).ceil();
    let interval_s = interval_ms as f64 / 1000.0;
    let ramp = ramp as f64;
    let want = match own {
        Some(r) => {
            let others_need: f64 = others.iter().sum::<f64>() * interval_s * HEADROOM;
            let spare = (supply as f64 - others_need).max(0.0).floor();
            let demand = (r * interval_s * HEADROOM).ceil();
            fair.min(demand.max(spare.min(ramp)))
        }
        None => fair.min(ramp),
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
        assert_eq!(want(Some(40.0), &[10.0], 100, 5_000, 1), 80);
        assert_eq!(want(Some(10.0), &[40.0], 100, 5_000, 1), 25);
        assert_eq!(
            want(Some(10.0), &[40.0, 40.0, 40.0], 100, 5_000, 1),
            13,
            "1/8 floor"
        );
        // A quiet Envoy still gets the floor: 1/(2n) of the supply.
        assert_eq!(
            want(Some(0.1), &[100.0], 100, 5_000, 1),
            1,
            "capped by its own demand"
        );
        assert_eq!(
            want(Some(1.0), &[1_000.0], 100, 5_000, 1),
            7,
            "ceil(1 × 5 × 1.25)"
        );
        assert_eq!(
            want(Some(100.0), &[100_000.0], 100, 5_000, 1),
            25,
            "the floor: 100/4"
        );
        // A new Envoy (no span reported yet) gets the floor, but no more than the limit
        // refills in an interval (`ramp`).
        assert_eq!(want(None, &[], 100, 5_000, 1_000), 50);
        assert_eq!(want(None, &[30.0, 30.0], 90, 5_000, 1_000), 15);
        assert_eq!(want(None, &[], 100, 5_000, 9), 9);
        // 1,000 a day: a new stream's first claim is 1 token, not 500.
        let day = OpKind::TokenBucket {
            capacity: 1_000,
            refill: 1_000,
            window_ms: 86_400_000,
        };
        assert_eq!(
            want(None, &[], 1_000, 5_000, refill_per_interval(day, 5_000)),
            1
        );
    }

    #[test]
    fn demand_may_grow_by_an_interval_of_refill_where_the_bucket_can_spare_it() {
        // 600 a minute, almost full: an Envoy at 1 a second (7 by its demand) is granted the
        // limit's refill over an interval, 50, so a step to 15 a second is not refused at once.
        let tb = OpKind::TokenBucket {
            capacity: 600,
            refill: 600,
            window_ms: 60_000,
        };
        let ramp = refill_per_interval(tb, 5_000);
        assert_eq!(ramp, 50);
        assert_eq!(want(Some(1.0), &[], 590, 5_000, ramp), 50);
        // Beside others, the floor-weighted share bounds it (1/4 of 100), and only what their
        // demand leaves is spare: 100 − 14 × 5 × 1.25 = 12.
        assert_eq!(want(Some(1.0), &[5.0], 100, 5_000, ramp), 25);
        assert_eq!(want(Some(1.0), &[14.0], 100, 5_000, ramp), 12);
        // Scarce: the weights decide, as before.
        assert_eq!(want(Some(1.0), &[100.0], 100, 5_000, ramp), 7);
        let fw = OpKind::FixedWindow {
            limit: 100,
            window_ms: 30_000,
        };
        assert_eq!(refill_per_interval(fw, 5_000), 17, "ceil(100 × 5 / 30)");
    }

    #[test]
    fn an_envoy_never_asks_beyond_its_demand_or_the_supply() {
        assert_eq!(
            want(Some(2.0), &[], 100, 5_000, 1),
            13,
            "ceil(2 × 5 × 1.25)"
        );
        assert_eq!(want(Some(1e9), &[], 100, 5_000, 1), 100);
        assert_eq!(
            want(Some(0.0), &[], 100, 5_000, 1),
            1,
            "no demand: one token"
        );
        assert_eq!(want(Some(0.0), &[0.0], 100, 5_000, 1), 1);
    }
}
