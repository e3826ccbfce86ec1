//! The rate-limit rules: what users declare, how it is loaded, and how a request finds its limit.
//!
//! Loading, in the order the data flows:
//!
//! - `load.rs` reads the rules path (a file, or a directory of `*.yaml`/`*.yml` files) and
//!   hands each file's text to the walk; it gathers every file's problems into one
//!   [`RulesError`] or builds the [`RuleSet`], and refuses a domain declared twice.
//! - `yaml.rs` parses a file into a tree that keeps every node's line and column, and reads
//!   YAML shapes (a mapping's fields, a string, a number, a list), recording wrong shapes.
//! - `validate/` walks one file's tree, checking what the fields mean and resolving defaults:
//!   `mod.rs` the domain, descriptor levels and descriptors; `limit.rs` their limits and rates.
//! - `error.rs` holds [`RuleError`] (`file:line:col: field: message`), [`RulesError`], and the
//!   per-file record of errors and warnings the readers and the walk write to.
//!
//! Using the rules: `model.rs` holds the loaded types (immutable once built; a calendar
//! window's [`Calendar`] is `quota/calendar.rs`'s); `matcher.rs`
//! walks the tree for one request descriptor; `reload.rs` watches the rules path and swaps a
//! new set in atomically.

pub mod error;
pub mod load;
pub mod matcher;
pub mod model;
pub mod reload;
mod validate;
pub mod xds;
pub mod yaml;

pub use crate::quota::calendar::{Calendar, CalendarUnit};
pub use error::{RuleError, RulesError};
pub use load::load_path;
pub use model::LoadOptions;
pub use model::{
    Algorithm, Descriptor, Domain, FallbackMode, LeaseRule, Limit, Rate, RuleSet, RulesSummary,
    Unit,
};
