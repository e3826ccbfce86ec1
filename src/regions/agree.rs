//! Whether the regions agree on how a global limit is shared. Every replica publishes, with its
//! heartbeat, the settings its shares are computed from (its [`View`]: the regions and their
//! weights, the floor, the lease, and a digest of the global limits in its rules); each reads
//! every live replica's back. A view that differs from this replica's is a **disagreement**:
//! reported loudly (an ERROR naming both sides, `tollgate_region_disagreements`, the
//! `TollgateRegionsDisagree` alert, `/readyz`), and met with the safe side, so the shares still
//! add up to at most the limit:
//!
//! - **Regions, weights or floor differ**: this replica's share of a key is the smallest of what
//!   every view present gives its region for the same demand (a region missing from a view's
//!   list gets nothing under it). Every replica takes the minimum over the same views, so the
//!   shares add up to at most what any one view gives, which is at most the limit.
//! - **The global limits differ** (a rules rollout half done, or two rule sets): the buckets'
//!   keys differ, so the regions do not even see each other's demand. Under such a view every
//!   region is held to its partition share, as if no region were heard from.
//! - **Only the lease differs**: the shares are computed alike; reported, nothing else (the
//!   lease sets how long a cut-off region keeps its share: docs/regions.md, "The bound").
//!
//! The text a replica publishes is readable (`regions=us:1,eu:1 floor=0.1 lease_ms=10000
//! rules=…`), so the ERROR shows both sides as they are.

/// One replica's settings for sharing global limits.
#[derive(Clone, Debug, PartialEq)]
pub struct View {
    /// Every region, in the order of `regions`.
    pub regions: Vec<String>,
    /// Each region's weight, in the same order.
    pub weights: Vec<f64>,
    /// `region_floor`.
    pub floor: f64,
    /// `region_lease_ms`.
    pub lease_ms: u64,
    /// `RuleSet::global_digest` of its rules.
    pub rules: String,
}

impl View {
    /// The text published with the heartbeat.
    pub fn text(&self) -> String {
        let regions: Vec<String> = self
            .regions
            .iter()
            .zip(&self.weights)
            .map(|(r, w)| format!("{r}:{w}"))
            .collect();
        format!(
            "regions={} floor={} lease_ms={} rules={}",
            regions.join(","),
            self.floor,
            self.lease_ms,
            self.rules
        )
    }

    /// Reads what [`View::text`] wrote; `None` for anything else (an older release publishes
    /// nothing, and is not counted as disagreeing).
    pub fn parse(text: &str) -> Option<View> {
        let (mut regions, mut weights) = (Vec::new(), Vec::new());
        let (mut floor, mut lease_ms, mut rules) = (None, None, None);
        for part in text.split(' ') {
            let (name, value) = part.split_once('=')?;
            match name {
                "regions" => {
                    for r in value.split(',') {
                        let (region, weight) = r.split_once(':')?;
                        regions.push(region.to_string());
                        weights.push(weight.parse::<f64>().ok().filter(|w| *w > 0.0)?);
                    }
                }
                "floor" => floor = value.parse::<f64>().ok(),
                "lease_ms" => lease_ms = value.parse::<u64>().ok(),
                "rules" => rules = Some(value.to_string()),
                _ => {}
            }
        }
        Some(View {
            regions,
            weights,
            floor: floor?,
            lease_ms: lease_ms?,
            rules: rules?,
        })
    }

    /// Whether shares computed under `other` may differ from shares computed under this view.
    pub fn shares_differ(&self, other: &View) -> bool {
        self.regions != other.regions
            || self.weights != other.weights
            || self.floor != other.floor
            || self.rules != other.rules
    }
}

/// A live replica whose view differs from this one's.
#[derive(Clone, Debug, PartialEq)]
pub struct Disagreement {
    pub region: String,
    pub replica: String,
    /// Its published text.
    pub settings: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view() -> View {
        View {
            regions: vec!["us".into(), "eu".into()],
            weights: vec![4.0, 1.0],
            floor: 0.1,
            lease_ms: 10_000,
            rules: "0123456789abcdef".into(),
        }
    }

    #[test]
    fn a_view_reads_back_what_it_wrote() {
        let v = view();
        assert_eq!(
            v.text(),
            "regions=us:4,eu:1 floor=0.1 lease_ms=10000 rules=0123456789abcdef"
        );
        assert_eq!(View::parse(&v.text()), Some(v));
        let odd = View {
            weights: vec![0.333, 2.5],
            ..view()
        };
        assert_eq!(View::parse(&odd.text()), Some(odd));
    }

    #[test]
    fn anything_else_is_not_a_view() {
        for text in [
            "",
            "regions=us:1",
            "regions=us floor=0.1 lease_ms=1 rules=x",
            "regions=us:0 floor=0.1 lease_ms=1 rules=x",
            "regions=us:1 floor=x lease_ms=1 rules=x",
        ] {
            assert_eq!(View::parse(text), None, "{text}");
        }
    }

    #[test]
    fn only_what_the_shares_are_computed_from_makes_them_differ() {
        let v = view();
        let lease = View {
            lease_ms: 5_000,
            ..view()
        };
        assert!(!v.shares_differ(&lease));
        let weights = View {
            weights: vec![1.0, 4.0],
            ..view()
        };
        assert!(v.shares_differ(&weights));
        let rules = View {
            rules: "none".into(),
            ..view()
        };
        assert!(v.shares_differ(&rules));
    }
}
