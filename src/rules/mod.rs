//! The rate-limit rules: what users declare, how it is loaded, and how a request finds its limit.
//!
//! `yaml.rs` parses YAML keeping every node's position; `load.rs` turns files into a validated
//! [`RuleSet`] (errors with file:line); `model.rs` holds the types; `matcher.rs` walks the tree
//! for one descriptor; `reload.rs` watches the rules path and swaps a new set in atomically.

pub mod load;
pub mod matcher;
pub mod model;
pub mod reload;
pub mod yaml;

pub use load::{LoadOptions, RuleError, RulesError, load_path};
pub use model::{Algorithm, Descriptor, Domain, Limit, Rate, RuleSet, Unit};
