//! The quota core: what a bucket operation is and what it does, with no store, clock or
//! request shape in it.
//!
//! The limiter turns a request into [`Op`]s (`ops.rs`); a store applies each to its bucket's
//! state with the math of `bucket.rs` (the memory store calls it directly, Redis runs its Lua
//! mirror in `lua/`) and hands back one [`Outcome`] per op. Leases ([`Action::Claim`] and
//! [`Action::Return`]) are ops too, so whoever holds a share of a quota (a replica's lease
//! today) is accounted for by the same math. Every part of a quota handed out (the local
//! fallback's share, a shard, a lease) is computed in `share.rs`.

pub mod bucket;
pub mod calendar;
pub mod lease;
pub mod ops;
pub mod share;

pub use bucket::{ClaimAsk, Outcome};
pub use ops::{Action, Op, OpKind};
