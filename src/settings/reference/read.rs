//! The one reader every step of [`from_reference_env`](super::from_reference_env) shares: it
//! looks the reference's variables up, notes which were read for a setting, and gathers the
//! `(setting, value)` pairs and the warning's lines in the order the steps produce them.
//!
//! Data flows one way: `get` (the process environment, or a test's map) → [`Reader::var`] and
//! friends, called by the table's loop (`table.rs`) and the hand-written steps (`mod.rs`,
//! `redis.rs`, `stats.rs`) → [`Reader::finish`] → [`Mapped`]. The steps never hold the
//! environment themselves, so what counts as set (non-empty) and as read is decided here once.

use super::{Mapped, REFERENCE_DEFAULTS, Refused, parse_bool};

/// The reference's environment being mapped, and what the mapping has produced so far.
pub(super) struct Reader<'a> {
    get: &'a dyn Fn(&str) -> Option<String>,
    /// Every variable read for a setting, for `Mapped::read` (and so that the naming of the
    /// ignored ones skips it).
    read: Vec<String>,
    env: Vec<(&'static str, String)>,
    /// `(setting, variables)` for each setting set from variables, for `Mapped::origins`.
    origins: Vec<(&'static str, String)>,
    ignored: Vec<String>,
}

impl<'a> Reader<'a> {
    pub(super) fn new(get: &'a dyn Fn(&str) -> Option<String>) -> Self {
        Reader {
            get,
            read: Vec::new(),
            env: Vec::new(),
            origins: Vec::new(),
            ignored: Vec::new(),
        }
    }

    /// `name`'s value if it is set, without noting it as read: for a variable only looked at
    /// (one that gates others, or is named in the warning when set).
    pub(super) fn peek(&self, name: &str) -> Option<String> {
        // Empty counts as unset, as in envconfig with no default.
        (self.get)(name).filter(|v| !v.is_empty())
    }

    /// `name`'s value if it is set, noted as read for a setting.
    pub(super) fn var(&mut self, name: &str) -> Option<String> {
        let value = self.peek(name);
        if value.is_some() {
            self.read.push(name.to_string());
        }
        value
    }

    /// `name` as Go's `strconv.ParseBool` reads it (noted as read), or refused.
    pub(super) fn flag(&mut self, name: &'static str) -> Result<Option<bool>, Refused> {
        match self.var(name) {
            None => Ok(None),
            Some(v) => bool_value(name, &v).map(Some),
        }
    }

    /// Whether `name` is set to a true boolean, without noting it as read (a value that is
    /// not a boolean counts as false here: the variables looked at this way are not refused).
    pub(super) fn on(&self, name: &str) -> bool {
        self.peek(name).as_deref().and_then(parse_bool) == Some(true)
    }

    /// Whether `name` was read for a setting so far.
    pub(super) fn was_read(&self, name: &str) -> bool {
        self.read.iter().any(|r| r == name)
    }

    /// One `(setting, value)` pair, in the schema's names.
    pub(super) fn set(&mut self, key: &'static str, value: String) {
        self.env.push((key, value));
    }

    /// [`Reader::set`] for a value made from the variables `from`: those of them that are set
    /// are recorded as where it comes from, so a value the settings refuse later names the
    /// variables the user wrote, not only the setting.
    pub(super) fn set_from(&mut self, from: &[&str], key: &'static str, value: String) {
        let set: Vec<&str> = from
            .iter()
            .copied()
            .filter(|name| self.peek(name).is_some())
            .collect();
        if !set.is_empty() {
            self.origins.push((key, set.join(" and ")));
        }
        self.set(key, value);
    }

    /// One `NAME (why)` line of the startup warning.
    pub(super) fn ignore(&mut self, line: String) {
        self.ignored.push(line);
    }

    /// What was mapped, with the reference's defaults ([`REFERENCE_DEFAULTS`]).
    pub(super) fn finish(self) -> Mapped {
        let mut read = self.read;
        read.sort();
        read.dedup();
        let defaults = REFERENCE_DEFAULTS
            .iter()
            .map(|(k, v)| (*k, v.to_string()))
            .collect();
        Mapped {
            env: self.env,
            origins: self.origins,
            ignored: self.ignored,
            read,
            defaults,
        }
    }
}

/// `value` of `name` as Go's `strconv.ParseBool` reads it, or refused.
pub(super) fn bool_value(name: &'static str, value: &str) -> Result<bool, Refused> {
    parse_bool(value).ok_or_else(|| refuse(name, value, "not a boolean (true or false)"))
}

/// The refusal of `name=value`, with why.
pub(super) fn refuse(name: &'static str, value: &str, why: &str) -> Refused {
    Refused {
        name,
        value: value.to_string(),
        why: why.to_string(),
    }
}
