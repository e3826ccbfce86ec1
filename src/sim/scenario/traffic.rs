//! The scenario's `traffic:` section: the streams of requests, their descriptor entries and
//! the value templates that pick a tenant (`{zipf}`, `{uniform}`).
//!
//! Flow: [`traffic`] reads each stream ([`stream`]) → its entries ([`entries`]) → each value
//! into a [`Template`] ([`template`]) → the driver renders a template per request
//! ([`Template::render`]) with the index its pick draws.

use super::fields::{number, positive_uint};
use super::{MAX_DURATION_S, MAX_RATE};
use crate::rules::error::Problems;
use crate::rules::yaml::{self, Node};

/// One stream of requests.
#[derive(Clone, Debug, PartialEq)]
pub struct Traffic {
    pub domain: String,
    /// Descriptor entries: key, and the value's template.
    pub entries: Vec<(String, Template)>,
    /// The index range of `{zipf}` and `{uniform}`.
    pub tenants: u64,
    pub zipf_exponent: f64,
    /// Requests per second across the fleet.
    pub rate_per_s: f64,
    pub arrivals: Arrivals,
    pub routing: Routing,
    pub cost: u64,
    /// The region whose replicas it reaches (`regions:` scenarios: required there, refused
    /// elsewhere; its index into `regions.names` once checked).
    pub region: Option<String>,
    /// When it starts and stops (virtual seconds; the whole run by default).
    pub from_s: f64,
    pub to_s: Option<f64>,
}

/// A descriptor value: fixed text, or text around one `{zipf}` or `{uniform}` index.
#[derive(Clone, Debug, PartialEq)]
pub enum Template {
    Fixed(String),
    Indexed {
        before: String,
        pick: Pick,
        after: String,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pick {
    Zipf,
    Uniform,
}

/// When requests come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arrivals {
    /// Independent arrivals (exponential gaps): real traffic's bunching.
    Poisson,
    /// One every 1/rate seconds exactly: a count that does not vary between seeds.
    Even,
}

/// Which replica a request goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    /// Round robin over the live replicas (Envoy's default).
    Even,
    /// A descriptor keeps its replica while the fleet size stays (hash of the values).
    Sticky,
    /// A uniformly random live replica.
    Random,
}

pub(super) fn traffic(out: &mut Problems, node: &Node) -> Option<Vec<Traffic>> {
    let list = yaml::seq(out, node, "traffic")?;
    if list.is_empty() {
        out.error(node.pos, "traffic", "no traffic: give at least one stream");
        return None;
    }
    let mut all = Some(Vec::new());
    for (i, item) in list.iter().enumerate() {
        let one = stream(out, item, &format!("traffic[{i}]"));
        match (&mut all, one) {
            (Some(all), Some(one)) => all.push(one),
            _ => all = None,
        }
    }
    all
}

fn stream(out: &mut Problems, node: &Node, path: &str) -> Option<Traffic> {
    let f = yaml::fields(
        out,
        node,
        path,
        &[
            "domain",
            "entries",
            "tenants",
            "zipf_exponent",
            "rate_per_s",
            "arrivals",
            "routing",
            "cost",
            "region",
            "from_s",
            "to_s",
        ],
    )?;
    let field = |name: &str| yaml::join(path, name);
    let domain = match f.get("domain") {
        Some(n) => yaml::string(out, n, &field("domain")),
        None => {
            out.error(node.pos, &field("domain"), "missing (required)");
            None
        }
    };
    let entries = match f.get("entries") {
        Some(n) => entries(out, n, &field("entries")),
        None => {
            out.error(node.pos, &field("entries"), "missing (required)");
            None
        }
    };
    let tenants = match f.get("tenants") {
        Some(n) => positive_uint(out, n, &field("tenants"), 1 << 40),
        None => Some(1),
    };
    let zipf_exponent = match f.get("zipf_exponent") {
        Some(n) => number(out, n, &field("zipf_exponent"), 0.0, 10.0),
        None => Some(1.0),
    };
    let rate_per_s = match f.get("rate_per_s") {
        Some(n) => number(out, n, &field("rate_per_s"), 0.001, MAX_RATE),
        None => {
            out.error(node.pos, &field("rate_per_s"), "missing (required)");
            None
        }
    };
    let routing = match f.get("routing") {
        None => Some(Routing::Even),
        Some(n) => match yaml::string(out, n, &field("routing")).as_deref() {
            Some("even") => Some(Routing::Even),
            Some("sticky") => Some(Routing::Sticky),
            Some("random") => Some(Routing::Random),
            Some(other) => {
                out.error(
                    n.pos,
                    &field("routing"),
                    format!("unknown routing `{other}` (expected even, sticky or random)"),
                );
                None
            }
            None => None,
        },
    };
    let arrivals = match f.get("arrivals") {
        None => Some(Arrivals::Poisson),
        Some(n) => match yaml::string(out, n, &field("arrivals")).as_deref() {
            Some("poisson") => Some(Arrivals::Poisson),
            Some("even") => Some(Arrivals::Even),
            Some(other) => {
                out.error(
                    n.pos,
                    &field("arrivals"),
                    format!("unknown arrivals `{other}` (expected poisson or even)"),
                );
                None
            }
            None => None,
        },
    };
    let cost = match f.get("cost") {
        Some(n) => positive_uint(out, n, &field("cost"), u64::from(u32::MAX)),
        None => Some(1),
    };
    let region = match f.get("region") {
        Some(n) => yaml::string(out, n, &field("region")).map(Some),
        None => Some(None),
    };
    let from_s = match f.get("from_s") {
        Some(n) => number(out, n, &field("from_s"), 0.0, MAX_DURATION_S as f64),
        None => Some(0.0),
    };
    let to_s = match f.get("to_s") {
        Some(n) => number(out, n, &field("to_s"), 0.001, MAX_DURATION_S as f64).map(Some),
        None => Some(None),
    };
    if let (Some(from), Some(Some(to))) = (from_s, to_s)
        && to <= from
    {
        out.error(
            f.get("to_s").map_or(node.pos, |n| n.pos),
            &field("to_s"),
            format!("must be after from_s ({from} s)"),
        );
        return None;
    }
    Some(Traffic {
        domain: domain?,
        entries: entries?,
        tenants: tenants?,
        zipf_exponent: zipf_exponent?,
        rate_per_s: rate_per_s?,
        arrivals: arrivals?,
        routing: routing?,
        cost: cost?,
        region: region?,
        from_s: from_s?,
        to_s: to_s?,
    })
}

fn entries(out: &mut Problems, node: &Node, path: &str) -> Option<Vec<(String, Template)>> {
    let list = yaml::seq(out, node, path)?;
    if list.is_empty() {
        out.error(
            node.pos,
            path,
            "no entries: a descriptor needs at least one",
        );
        return None;
    }
    let mut all = Some(Vec::new());
    for (i, item) in list.iter().enumerate() {
        let p = format!("{path}[{i}]");
        let one = yaml::fields(out, item, &p, &["key", "value"]).and_then(|f| {
            let key = f.get("key").and_then(|n| yaml::string(out, n, &p));
            if !f.contains_key("key") {
                out.error(item.pos, &yaml::join(&p, "key"), "missing (required)");
            }
            let value = match f.get("value") {
                Some(n) => yaml::string(out, n, &p).and_then(|v| template(out, n, &p, &v)),
                None => {
                    out.error(item.pos, &yaml::join(&p, "value"), "missing (required)");
                    None
                }
            };
            Some((key?, value?))
        });
        match (&mut all, one) {
            (Some(all), Some(one)) => all.push(one),
            _ => all = None,
        }
    }
    all
}

fn template(out: &mut Problems, node: &Node, path: &str, value: &str) -> Option<Template> {
    let found: Vec<(usize, Pick, usize)> = [("{zipf}", Pick::Zipf), ("{uniform}", Pick::Uniform)]
        .iter()
        .flat_map(|(pat, pick)| {
            value
                .match_indices(pat)
                .map(move |(at, _)| (at, *pick, pat.len()))
        })
        .collect();
    match found.as_slice() {
        [] => Some(Template::Fixed(value.to_string())),
        [(at, pick, len)] => Some(Template::Indexed {
            before: value[..*at].to_string(),
            pick: *pick,
            after: value[at + len..].to_string(),
        }),
        _ => {
            out.error(
                node.pos,
                &yaml::join(path, "value"),
                "at most one {zipf} or {uniform} in a value",
            );
            None
        }
    }
}

impl Template {
    /// The value for tenant index `i` (ignored by a fixed value).
    pub fn render(&self, i: u64, buf: &mut String) {
        use std::fmt::Write;
        buf.clear();
        match self {
            Template::Fixed(v) => buf.push_str(v),
            Template::Indexed { before, after, .. } => {
                buf.push_str(before);
                let _ = write!(buf, "{i}");
                buf.push_str(after);
            }
        }
    }

    pub fn pick(&self) -> Option<Pick> {
        match self {
            Template::Fixed(_) => None,
            Template::Indexed { pick, .. } => Some(*pick),
        }
    }
}
