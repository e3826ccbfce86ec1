//! The decision for one request: what a request and its answer look like, and [`Limiter::decide`],
//! which runs the steps in order.
//!
//! # How a request flows
//!
//! 1. **Plan** ([`plan`]): each descriptor is matched against the domain's rules; its limits
//!    are the matched ones minus those another matched limit `replaces` (or Envoy's per-request
//!    override instead); every counted limit becomes one store [`Op`](crate::quota::Op) with its
//!    key (`keys.rs`) and cost. Unlimited limits get no op.
//! 2. **Hot keys, then the store** (`hot/`): ops a lease covers (`quota/lease/`) or the
//!    over-limit cache refuses (`overlimit.rs`) are answered here; the rest (and lease claims)
//!    go to the [`Store`] in one call (one round trip for Redis), and a sharded op refused by
//!    its shard tries one other (`shard.rs`). Every descriptor is charged, as in
//!    envoyproxy/ratelimit. One [`Outcome`](crate::quota::Outcome) per op, in op order; the math is
//!    [`quota::bucket`](crate::quota::bucket).
//! 3. **Fallback** ([`fallback`]): an op the store could not answer (a failure, a timeout, an
//!    open circuit of its node) is decided by its limit's fallback mode: a local share of the
//!    quota, open, closed, or `error`, which fails the whole request (gRPC UNAVAILABLE).
//! 4. **Fold** ([`status`]): the outcomes become one [`Status`] per descriptor, in request
//!    order, and an overall [`Code`]; each descriptor's decision is counted in the metrics.
//!
//! Leased tokens and the fallback: while a node's circuit is open, tokens already leased stay
//! spendable until their TTL; a claim that fails falls back like any op, for its request's
//! cost, and a sharded limit falls back as a whole limit (not one shard's part).

mod counters;
pub mod decision_log;
pub mod fallback;
mod hot;
mod overlimit;
mod plan;
mod receipt;
mod shard;
mod status;

#[cfg(test)]
mod fixture;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub use counters::{BucketView, ShardView};
pub use fallback::FallbackMode;
pub use hot::HotKeyConfig;
pub use shard::seed_picks as seed_shard_picks;

use crate::clock::Clock;
use crate::fleet::Replicas;
use crate::quota::{Op, OpKind, Outcome};
use crate::rules::{Algorithm, Domain, Limit, RuleSet, Unit};
use crate::store::{Store, StoreError, StoreErrorKind};
use crate::telemetry::Metrics;

pub use plan::OVERRIDE_CLASS;
use status::Modes;
pub use status::UNKNOWN_DOMAIN;

/// One request, already validated by the service layer; borrows the caller's strings.
#[derive(Clone, Debug, Default)]
pub struct Request<'a> {
    pub domain: &'a str,
    pub descriptors: Vec<RequestDescriptor<'a>>,
    /// Request-level cost; 0 means 1.
    pub hits_addend: u64,
}

#[derive(Clone, Debug, Default)]
pub struct RequestDescriptor<'a> {
    pub entries: Vec<(&'a str, &'a str)>,
    /// Descriptor-level cost; overrides the request's. `Some(0)` checks without consuming.
    pub hits_addend: Option<u64>,
    /// Envoy's per-descriptor `limit`: used instead of the rules' limit, as in the reference.
    pub limit_override: Option<LimitOverride>,
    /// Envoy's `is_negative_hits`: the cost is given back to each of the descriptor's buckets
    /// (capped at its capacity) instead of taken; see `plan.rs`.
    pub refund: bool,
}

/// `RateLimitDescriptor.limit`: requests per unit supplied by Envoy's route config.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LimitOverride {
    pub requests_per_unit: u32,
    pub unit: Unit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Code {
    Ok,
    OverLimit,
}

/// The limit a status reports (`current_limit` in the response).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReportedLimit {
    pub requests_per_unit: u32,
    pub unit: Unit,
    pub name: String,
    /// Most a client can spend at once: the token bucket's `burst` (else `requests_per_unit`).
    /// `remaining` never exceeds it.
    pub capacity: u64,
    /// The refill window (unit × `unit_multiplier`) in milliseconds.
    pub window_ms: u64,
}

/// The answer for one descriptor.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    /// `None` for no rule and for unlimited.
    pub limit: Option<ReportedLimit>,
    pub remaining: u32,
    /// Milliseconds until the bucket is full again / the window ends (0 without a limit).
    pub reset_ms: u64,
    /// Over the limit: milliseconds until the cost would fit, if it ever can.
    pub retry_ms: Option<u64>,
    /// Over a limit in shadow mode (reported as OK).
    pub shadow: bool,
    /// Over quota-mode limits only: reported OVER_LIMIT, but the overall code is OVER_LIMIT
    /// only if a limit without quota mode is over too, or every quota-mode limit is.
    pub quota_mode: bool,
    /// The matched descriptor's `metadata`, for the response's dynamic metadata.
    pub metadata: Option<Arc<serde_json::Value>>,
    /// A reservation that passed: `(key, receipt)`, returned in the response's dynamic
    /// metadata as `metadata.<key>` for its settlement to read (`receipt.rs`).
    pub receipt: Option<(String, String)>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub overall: Code,
    pub statuses: Vec<Status>,
    /// Whether the fallback decided any of the request's ops (the store could not answer).
    pub from_fallback: bool,
}

/// One op's answer from [`hot`]: the outcome or the store's error, and what answered it
/// without the store (a lease, the over-limit cache), if anything.
pub(crate) type Answer = (Result<Outcome, StoreError>, Option<Source>);

/// What answered one op of a decision (the decision log's `source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The store, on the shared bucket.
    Store,
    /// This replica's lease of the bucket.
    Lease,
    /// This replica's over-limit cache.
    OverLimitCache,
    /// The limit's fallback, because the store failed so (`deadline`: the caller's deadline
    /// came first).
    Fallback(StoreErrorKind),
}

impl Source {
    pub fn is_fallback(self) -> bool {
        matches!(self, Source::Fallback(_))
    }

    /// The name of a source answered in this replica: the `reason` label of
    /// `tollgate_local_decisions_total`, and the decision log's.
    pub fn label(self) -> &'static str {
        match self {
            Source::Store => "store",
            Source::Lease => "lease",
            Source::OverLimitCache => "over_limit_cache",
            Source::Fallback(_) => "fallback",
        }
    }
}

/// What an RLQS bucket draws from ([`Limiter::quota_of`]).
#[derive(Clone, Debug, PartialEq)]
pub enum Quota {
    /// No rule matches: no limit, as an RLS descriptor that matches nothing.
    NoRule,
    /// The rule says `unlimited: true`.
    Unlimited,
    /// One counted limit: its shared bucket.
    Counted {
        limit: Arc<Limit>,
        key: String,
        kind: OpKind,
    },
    /// More than one counted limit (a domain without `rlqs: true`): not served.
    Unservable,
}

/// One op of [`Limiter::ideal_ops`]: what one exact bucket of a limit takes.
#[derive(Clone, Debug)]
pub struct IdealOp {
    pub op: Op,
    /// The limit's metrics class.
    pub class: Arc<str>,
    /// The index of its descriptor in the request.
    pub desc: usize,
    /// A `global: true` limit: one bucket across regions (else one per region).
    pub global: bool,
}

/// Settings the decision loop needs.
#[derive(Clone, Debug)]
pub struct LimiterConfig {
    pub key_prefix: String,
    /// Global shadow mode: the overall code is always OK (statuses stay as decided).
    pub shadow_mode: bool,
    /// Global quota mode: every limit is quota-mode (`Limit::quota_mode`).
    pub quota_mode: bool,
    /// The algorithm of Envoy-supplied limit overrides.
    pub default_algorithm: Algorithm,
    /// `sliding_log_max_limit`: an override past it is not served as a sliding log (whose
    /// memory and script time grow with the limit) but as a sliding window.
    pub sliding_log_max_limit: u64,
    /// What an op falls back to when the store cannot answer, unless its limit says otherwise.
    pub fallback: FallbackMode,
    /// Live replicas, for the local fallback's share (kept current by the membership task).
    pub replicas: Arc<Replicas>,
    /// This region's shares of the `global: true` limits (`regions/`), when `global_store` is
    /// set; without it a global limit is an ordinary one.
    pub regions: Option<Arc<crate::regions::Shares>>,
    /// What the `closed` fallback tells a client to wait (one breaker probe interval).
    pub closed_retry_ms: u64,
    /// Leasing, the over-limit cache and shard retries.
    pub hot: HotKeyConfig,
    /// The clock of leases and the over-limit cache (monotonic ms).
    pub clock: Clock,
    /// Admitted past this share of the limit counts as `near_limit` in the decision metrics.
    pub near_limit_ratio: f64,
    /// The most buckets the local fallback holds (as the memory store: `memory_max_keys`).
    pub fallback_max_keys: usize,
    /// Series per `detailed_metric` limit before its values count as `<class>.(overflow)`.
    pub detailed_metric_max_series: usize,
    /// The decision log (`decision_log.rs`): lines a second at most, and whether descriptor
    /// values are shown (else hashed).
    pub decision_log_per_s: u64,
    pub decision_log_values: bool,
}

impl LimiterConfig {
    /// The defaults (no leasing, sharding or cache; local fallback), on `clock`.
    pub fn new(clock: Clock) -> Self {
        LimiterConfig {
            key_prefix: "tollgate:".into(),
            shadow_mode: false,
            quota_mode: false,
            default_algorithm: Algorithm::TokenBucket,
            sliding_log_max_limit: crate::rules::model::SLIDING_LOG_MAX_LIMIT,
            fallback: FallbackMode::Local,
            replicas: Arc::new(Replicas::new(0, 1)),
            regions: None,
            closed_retry_ms: 500,
            hot: HotKeyConfig::default(),
            clock,
            fallback_max_keys: crate::store::memory::DEFAULT_MAX_KEYS,
            detailed_metric_max_series: 1_000,
            near_limit_ratio: 0.8,
            decision_log_per_s: 20,
            decision_log_values: true,
        }
    }
}

/// How often [`Limiter::housekeeping`] runs: idle buckets, ended cache entries and leases go,
/// and ended leases' unspent tokens are given back.
pub const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug)]
pub struct Limiter {
    /// Shared with the background claims of leases (`hot/round.rs`).
    store: Arc<Store>,
    config: LimiterConfig,
    /// The metrics class of Envoy overrides, made once so no decision allocates it.
    override_class: Arc<str>,
    tally: status::Tally,
    fallback: fallback::Fallback,
    /// Shared with a settlement's store call, which outlives its request when the decision
    /// budget runs out (see [`Limiter::decide_within`]).
    hot: Arc<hot::HotKeys>,
    /// `tollgate_late_decisions_total`'s series: a request past its budget when read, and one
    /// the store did not answer within it.
    late_at_arrival: prometheus_client::metrics::counter::Counter,
    late_in_store: prometheus_client::metrics::counter::Counter,
    decision_log: decision_log::DecisionLog,
}

impl Limiter {
    pub fn new(store: Store, config: LimiterConfig, metrics: Arc<Metrics>) -> Self {
        Self::on_shared_store(Arc::new(store), config, metrics)
    }

    /// A limiter on a store that other limiters use too: several replicas in one process (the
    /// leasing property test), each with its own leases, caches and fallback.
    pub fn on_shared_store(
        store: Arc<Store>,
        config: LimiterConfig,
        metrics: Arc<Metrics>,
    ) -> Self {
        let fallback = fallback::Fallback::new(
            config.fallback,
            config.replicas.clone(),
            config.clock.clone(),
            config.closed_retry_ms,
            config.fallback_max_keys,
        );
        let hot = Arc::new(hot::HotKeys::new(
            config.hot,
            config.clock.clone(),
            metrics.hot.clone(),
        ));
        let late = |stage| {
            metrics
                .late_decisions
                .get_or_create(&crate::telemetry::StageLabels { stage })
                .clone()
        };
        let (late_at_arrival, late_in_store) = (late("arrival"), late("store"));
        let tally = status::Tally::new(
            metrics,
            config.near_limit_ratio,
            config.detailed_metric_max_series,
        );
        let decision_log =
            decision_log::DecisionLog::new(config.decision_log_per_s, config.decision_log_values);
        Limiter {
            store,
            config,
            override_class: OVERRIDE_CLASS.into(),
            tally,
            fallback,
            hot,
            late_at_arrival,
            late_in_store,
            decision_log,
        }
    }

    /// Housekeeping, about once a second: idle buckets of the memory store and of the local
    /// fallback, ended over-limit cache entries and idle leases are dropped.
    pub fn maintain(&self) {
        self.store.maintain();
        self.fallback.sweep();
        self.hot.sweep();
    }

    /// Runs the housekeeping every [`HOUSEKEEPING_EVERY`] on the limiter's clock until `stop`
    /// resolves: [`Limiter::maintain`], then [`Limiter::return_ended_leases`].
    pub async fn housekeeping(&self, stop: impl Future<Output = ()>) {
        tokio::pin!(stop);
        loop {
            tokio::select! {
                _ = &mut stop => return,
                () = self.config.clock.sleep(HOUSEKEEPING_EVERY) => {}
            }
            self.maintain();
            self.return_ended_leases().await;
        }
    }

    /// Graceful shutdown: gives the unspent tokens of this replica's leases back to their
    /// buckets (capped at capacity). Returns how many were given back.
    pub async fn return_leases(&self) -> u64 {
        self.hot.return_leases(&self.store).await
    }

    /// Housekeeping, after [`Limiter::maintain`]: gives the unspent tokens of leases that
    /// ended back to their buckets. Returns how many were given back.
    pub async fn return_ended_leases(&self) -> u64 {
        self.hot.return_ended_leases(&self.store).await
    }

    /// The replica count the local fallback divides by, and where it comes from.
    pub fn replicas(&self) -> &Replicas {
        &self.config.replicas
    }

    /// Domains requests named that no rules file declares (the first 100 names).
    pub fn unknown_domains(&self) -> Vec<String> {
        self.tally.unknown_domains()
    }

    /// The global fallback mode.
    pub fn fallback_mode(&self) -> FallbackMode {
        self.fallback.mode
    }

    pub fn store(&self) -> &Store {
        &self.store
    }

    /// This region's shares of the global limits, when they are shared across regions.
    pub fn regions(&self) -> Option<&crate::regions::Shares> {
        self.config.regions.as_deref()
    }

    /// The store, shared: for a background task that outlives a borrow (the regions'
    /// exchange tells its region's store whether this replica reaches the global store).
    pub fn store_handle(&self) -> Arc<Store> {
        self.store.clone()
    }

    /// Decides `req` against `rules`, with no deadline. What the store cannot answer goes to
    /// the fallback; only a failed op whose mode is `error` fails the whole request (the
    /// caller maps it to gRPC UNAVAILABLE so Envoy's failure mode applies).
    pub async fn decide(&self, rules: &RuleSet, req: &Request<'_>) -> Result<Decision, StoreError> {
        self.decide_within(rules, req, None).await
    }

    /// Decides `req` against `rules` within `budget`: the caller's deadline less the margin
    /// its answer needs to reach it (`service/deadline.rs`); `None`, no bound (as
    /// [`Limiter::decide`]).
    ///
    /// What the store has not answered when the budget runs out is decided by each limit's
    /// fallback, so the answer leaves before the caller gives up; a request already past its
    /// budget is not sent to the store at all. The rule for such a late op, by mode (the store
    /// may still run it: see docs/accuracy.md, "Late decisions"):
    /// - `local`: taken from this replica's local share, as in an outage. Refusing it (the
    ///   rule for a call that timed out while the store answers others) would fail closed for
    ///   as long as the store is slow; the share admits at most one share per replica per
    ///   refill period beyond the store's own count, the bound an outage has.
    /// - `open`, `closed`: admitted, refused.
    /// - `error`: the request fails (gRPC UNAVAILABLE) now, before the deadline, so Envoy's
    ///   failure mode decides, as it does for the reference.
    /// - A give-back (a refund) or a charge is not dropped: a request carrying one runs its
    ///   store call in a task of its own, even when it arrived past its budget, which applies
    ///   it when the store answers; the answer meanwhile gives nothing back locally (the store
    ///   will). What the store may also count (a late take or charge it ran, and the local
    ///   share took too) is counted twice: the safe side.
    ///
    /// A late request whose store part had at least `store_timeout_ms` counts a missed
    /// deadline against its ops' nodes ([`Store::missed_deadline`]), so a node that keeps
    /// answering late opens its breaker.
    pub async fn decide_within(
        &self,
        rules: &RuleSet,
        req: &Request<'_>,
        budget: Option<Duration>,
    ) -> Result<Decision, StoreError> {
        let Some(domain) = rules.domains.get(req.domain) else {
            self.tally.unknown_domain(req.domain, req.descriptors.len());
            return Ok(Decision::without_limits(req.descriptors.len()));
        };

        // 1. Match → limits → one op per counted limit.
        let plan = plan::plan(domain, req, &self.config, &self.override_class);
        // A reservation's receipt reckons its window's end from when its take was sent.
        let sent_ms = if plan.receipts.is_empty() {
            0
        } else {
            self.config.clock.wall_ms()
        };

        // 2. What this replica can answer from memory (leases, the over-limit cache), then one
        //    store call for the rest (none when nothing is counted), and a second for shard
        //    retries. The store counts its own failures (tollgate_store_errors_total{kind}).
        let results = match budget {
            Some(budget) if !plan.ops.is_empty() => self.apply_within(&plan, budget).await,
            _ => {
                self.hot
                    .apply(&self.store, &plan, self.config.replicas.count())
                    .await
            }
        };

        // 3. What the store could not answer, the fallback decides.
        let (mut outcomes, sources) = self.resolve(&plan, results)?;
        // A refund is never refused: on a sliding log, which takes none, it is a check that may
        // find the limit spent, but nothing was asked of it.
        for (o, p) in outcomes.iter_mut().zip(&plan.planned) {
            if req.descriptors[p.desc].refund {
                o.allowed = true;
                o.retry_ms = Some(0);
            }
        }

        // 4. Statuses, in request order, and the overall code.
        let mut decision = status::fold(
            &domain.name,
            req,
            &plan,
            &outcomes,
            &sources,
            Modes {
                shadow: self.config.shadow_mode,
                quota: self.config.quota_mode,
            },
            &self.tally,
        );

        // The decision log, when tollgate logs at debug (a level check otherwise).
        if self.decision_log.on() {
            let now = self.config.clock.mono_ms();
            self.decision_log
                .log(now, req, &plan, &outcomes, &sources, &decision);
        }

        // 5. Each reservation that passed gets its receipt.
        for (desc, key) in plan.receipts {
            let status = &mut decision.statuses[desc];
            if status.code != Code::Ok {
                continue;
            }
            let tokens = plan
                .planned
                .iter()
                .find(|p| p.desc == desc)
                .map_or(0, |p| p.cost);
            let ops = plan
                .planned
                .iter()
                .zip(&plan.ops)
                .zip(outcomes.iter().zip(&sources))
                .filter(|((p, _), _)| p.desc == desc)
                .map(|((_, op), (o, s))| (op, o, s.is_fallback()));
            status.receipt = Some((key, receipt::issue(tokens, sent_ms, ops)));
        }
        Ok(decision)
    }

    /// What the bucket of one descriptor's `entries` in `domain` draws from, planned as a
    /// request with that one descriptor would be (the same key, so RLS requests and RLQS
    /// assignments share one bucket). For RLQS (`rlqs/`), whose domains hold at most one
    /// counted limit per node (the rules check it at load).
    pub fn quota_of(&self, domain: &Domain, entries: &[(&str, &str)]) -> Quota {
        let req = Request {
            domain: &domain.name,
            descriptors: vec![RequestDescriptor {
                entries: entries.to_vec(),
                hits_addend: None,
                limit_override: None,
                refund: false,
            }],
            hits_addend: 1,
        };
        let plan = plan::plan(domain, &req, &self.config, &self.override_class);
        match (plan.planned.as_slice(), plan.ops.as_slice()) {
            ([planned], [op]) => Quota::Counted {
                limit: planned.limit.clone(),
                key: op.key.clone(),
                kind: op.kind,
            },
            ([], _) if plan.limits[0].is_empty() => Quota::NoRule,
            ([], _) => Quota::Unlimited,
            _ => Quota::Unservable,
        }
    }

    /// The ops one exact, central bucket per limit would apply for `req`: each counted limit's
    /// take of the whole limit (a sharded limit's whole bucket, not a shard, a global limit's
    /// whole limit, not this region's share), with the limit's metrics class and the index of
    /// its descriptor. `tollgate simulate` feeds them to one memory store on the arrival
    /// clock: what the fleet should have admitted.
    pub fn ideal_ops(&self, rules: &RuleSet, req: &Request<'_>) -> Vec<IdealOp> {
        let Some(domain) = rules.domains.get(req.domain) else {
            return Vec::new();
        };
        let plan = plan::plan(domain, req, &self.config, &self.override_class);
        plan.planned
            .iter()
            .zip(plan.ops)
            .map(|(planned, op)| IdealOp {
                op: whole_limit(planned, &op).unwrap_or(op),
                class: planned.limit.class.clone(),
                desc: planned.desc,
                global: planned.limit.global,
            })
            .collect()
    }

    /// Applies RLQS claims, give-backs and charges in one store call; what the store cannot
    /// answer is decided by each op's fallback mode (`limit` gives its own, else the global
    /// one): a claim from the local share of the quota under `local` (see
    /// `fallback::Fallback::claim`), everything asked under `open`, nothing under `closed`;
    /// `None` under `error` (the caller sends no assignment, so Envoy's own behaviour applies).
    /// A give-back the store did not take is dropped (tokens lost, never doubled).
    pub async fn apply_quota_ops(
        &self,
        ops: &[(Op, Option<FallbackMode>)],
    ) -> Vec<Option<(Outcome, bool)>> {
        let plain: Vec<Op> = ops.iter().map(|(op, _)| op.clone()).collect();
        let results = if plain.is_empty() {
            Vec::new()
        } else {
            self.store.apply_each(&plain).await
        };
        results
            .into_iter()
            .zip(ops)
            .map(|(result, (op, mode))| match result {
                Ok(outcome) => Some((outcome, false)),
                Err(e) => {
                    let mode = mode.unwrap_or(self.fallback.mode);
                    self.fallback
                        .claim(op, mode, e.outcome_unknown())
                        .map(|o| (o, true))
                }
            })
            .collect()
    }

    /// The store's part of a decision within `budget` (see [`Limiter::decide_within`]): the
    /// outcomes, or a [`StoreErrorKind::Deadline`] error for every op when the budget ran out.
    async fn apply_within(&self, plan: &plan::Plan, budget: Duration) -> Vec<Answer> {
        let late = || {
            let e = StoreError::new(
                StoreErrorKind::Deadline,
                "the decision budget (the caller's deadline less decision_margin_ms) ran out",
            );
            plan.ops.iter().map(|_| (Err(e.clone()), None)).collect()
        };
        let share = self.config.replicas.count();
        let settles = plan
            .ops
            .iter()
            .any(|op| op.action.is_return() || op.action == crate::quota::Action::Charge);
        if settles {
            // Its own task, even with no budget left: dropped, it would leave unknown whether
            // the store took the refund or charge (or never send it); let to run, the store
            // applies it whenever it answers, and the answer meanwhile is the fallback's.
            let (hot, store, owned) = (self.hot.clone(), self.store.clone(), plan.clone());
            let (tx, rx) = tokio::sync::oneshot::channel();
            self.config.clock.spawn(async move {
                let _ = tx.send(hot.apply(&store, &owned, share).await);
            });
            if budget.is_zero() {
                self.late_at_arrival.inc();
                return late();
            }
            if let Ok(Ok(results)) = self.config.clock.timeout(budget, rx).await {
                return results;
            }
        } else if budget.is_zero() {
            // Already past it when read (queued in this process, or a tiny grpc-timeout):
            // nothing is sent; the store has no part in the answer.
            self.late_at_arrival.inc();
            return late();
        } else if let Ok(results) = self
            .config
            .clock
            .timeout(budget, self.hot.apply(&self.store, plan, share))
            .await
        {
            // Dropped at the deadline otherwise: an op still queued for a batch goes unsent,
            // one sent is an unknown outcome (the fallback's rule for late ops covers it).
            return results;
        }
        self.late_in_store.inc();
        self.store.missed_deadline(&plan.ops, budget);
        late()
    }

    /// The store's answers, with each failed op decided by its limit's fallback mode (else the
    /// global one); also which outcomes came from the fallback. A failed op whose mode is
    /// `error` fails the request with the store's error.
    #[allow(clippy::type_complexity)]
    fn resolve(
        &self,
        plan: &plan::Plan,
        results: Vec<Answer>,
    ) -> Result<(Vec<Outcome>, Vec<Source>), StoreError> {
        let mut outcomes = Vec::with_capacity(results.len());
        let mut sources = Vec::with_capacity(results.len());
        for (((result, local), planned), op) in
            results.into_iter().zip(&plan.planned).zip(&plan.ops)
        {
            match result {
                Ok(o) => {
                    outcomes.push(o);
                    sources.push(local.unwrap_or(Source::Store));
                }
                Err(e) => {
                    let mode = planned.limit.fallback.unwrap_or(self.fallback.mode);
                    // A sharded limit falls back as a whole: the local share is of the limit,
                    // not of one shard.
                    let whole;
                    let op = match whole_limit(planned, op) {
                        Some(w) => {
                            whole = w;
                            &whole
                        }
                        None => op,
                    };
                    // A late op (the decision budget ran out) is decided as in an outage, not
                    // refused as a timed-out one is, but a late give-back gives nothing here:
                    // the store still gets it (see `apply_within`).
                    let unknown = match e.kind {
                        StoreErrorKind::Deadline => op.action.is_return(),
                        _ => e.outcome_unknown(),
                    };
                    let kind = e.kind;
                    outcomes.push(self.fallback.decide(op, mode, unknown).ok_or(e)?);
                    sources.push(Source::Fallback(kind));
                }
            }
        }
        Ok((outcomes, sources))
    }
}

/// A sharded limit's op on its whole bucket (the shard part of the key and the shard's part of
/// the numbers taken off), for what decides a limit as a whole: the local fallback, and
/// `tollgate simulate`'s ideal. `None` for an op that is not a shard's.
fn whole_limit(planned: &plan::Planned, op: &Op) -> Option<Op> {
    match (planned.shard, planned.limit.rate) {
        // The op's own action: a sharded refund stays a give-back.
        (Some(_), Some(rate)) => Some(Op {
            action: op.action,
            ..Op::take(
                crate::keys::bucket_id(&op.key).to_string(),
                OpKind::from(rate),
                op.cost,
            )
        }),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::fixture::{fixture, req};
    use super::*;

    #[test]
    fn counts_down_then_over_limit_and_keys_are_per_value() {
        let f = fixture(false);
        let a = req("edge", &[&[("tenant", "a")]]);
        let d = f.decide(&a);
        assert_eq!(d.overall, Code::Ok);
        let s = &d.statuses[0];
        assert_eq!(s.remaining, 1);
        assert_eq!(
            s.limit.as_ref().map(|l| (l.requests_per_unit, l.unit)),
            Some((2, Unit::Hour))
        );
        assert_eq!(
            s.reset_ms, 1_800_000,
            "one token of 2/hour refills in 30 min"
        );
        f.decide(&a);
        let d = f.decide(&a);
        assert_eq!(
            (d.overall, d.statuses[0].code),
            (Code::OverLimit, Code::OverLimit)
        );
        assert_eq!(d.statuses[0].retry_ms, Some(1_800_000));
        assert_eq!(
            f.decide(&req("edge", &[&[("tenant", "b")]])).overall,
            Code::Ok
        );
        let text = f.metrics.render();
        assert!(
            text.contains(
                r#"tollgate_decisions_total{domain="edge",class="tenant",outcome="over_limit"} 1"#
            ),
            "{text}"
        );
        assert!(
            !text.contains("class=\"a\""),
            "raw values never become labels"
        );
    }

    #[test]
    fn every_descriptor_is_charged_and_any_over_makes_the_request_over() {
        let f = fixture(false);
        let r = req("edge", &[&[("zero", "x")], &[("tenant", "c")]]);
        assert_eq!(f.codes(&r), [Code::OverLimit, Code::Ok]);
        assert_eq!(f.decide(&r).overall, Code::OverLimit);
        // tenant c was charged both times although the request was over: the third is over.
        assert_eq!(f.codes(&r), [Code::OverLimit, Code::OverLimit]);
        let zero = &f.decide(&r).statuses[0];
        assert_eq!(
            (zero.remaining, zero.retry_ms),
            (0, None),
            "0/s never admits, never waits"
        );
    }
}
