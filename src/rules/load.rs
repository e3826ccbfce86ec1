//! Loading rules files: path → YAML tree with positions → validated [`RuleSet`].
//!
//! The rules path is a `*.yaml`/`*.yml` file or a directory of them (not recursive; dotfiles
//! and dot-directories are skipped, so the `..data` links of a Kubernetes ConfigMap mount
//! work). Every file is checked in full and every problem is collected, so one run of
//! `tollgate check` lists them all, each as `file:line:col: field: message` pointing at the
//! offending node. The same function runs at startup and on reload.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::model::{Algorithm, Descriptor, Domain, Level, Limit, Origin, Rate, RuleSet, Unit};
use super::yaml::{self, Node, Pos, Value};

/// Settings that shape how rules are read.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoadOptions {
    /// The algorithm of a limit that does not name one.
    pub default_algorithm: Algorithm,
}

/// One problem in the rules, with the place it was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleError {
    pub file: PathBuf,
    /// 0 when the problem is the file itself (unreadable, missing).
    pub line: usize,
    pub col: usize,
    /// The dotted path of the offending field, e.g. `descriptors[0].rate_limit.unit`.
    pub field: String,
    pub message: String,
}

impl fmt::Display for RuleError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}:{}", self.line, self.col)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.message)
    }
}

/// Every problem found while loading a rules path.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub struct RulesError {
    pub errors: Vec<RuleError>,
}

impl fmt::Display for RulesError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.errors.len();
        write!(f, "{n} error{} in the rules", if n == 1 { "" } else { "s" })?;
        for e in &self.errors {
            write!(f, "\n  {e}")?;
        }
        Ok(())
    }
}

/// Loads and validates every rules file under `path`.
pub fn load_path(path: &Path, opts: LoadOptions) -> Result<RuleSet, RulesError> {
    let fail = |message: String| RulesError {
        errors: vec![RuleError {
            file: path.to_path_buf(),
            line: 0,
            col: 0,
            field: String::new(),
            message,
        }],
    };
    let meta =
        std::fs::metadata(path).map_err(|e| fail(format!("cannot read the rules path: {e}")))?;
    let files = if meta.is_dir() {
        list_dir(path).map_err(|e| fail(format!("cannot list the rules directory: {e}")))?
    } else {
        vec![path.to_path_buf()]
    };
    let mut sources = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => sources.push((file, text)),
            Err(e) => errors.push(RuleError {
                file,
                line: 0,
                col: 0,
                field: String::new(),
                message: format!("cannot read: {e}"),
            }),
        }
    }
    match load_sources(&sources, opts) {
        Ok(set) if errors.is_empty() => Ok(set),
        Ok(_) => Err(RulesError { errors }),
        Err(mut e) => {
            errors.append(&mut e.errors);
            Err(RulesError { errors })
        }
    }
}

/// The rules files in a directory: `*.yaml` and `*.yml`, no dotfiles, sorted by name.
fn list_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let yaml = name.ends_with(".yaml") || name.ends_with(".yml");
        // is_file follows symlinks: ConfigMap files are links into `..data/`.
        if !name.starts_with('.') && yaml && path.is_file() {
            files.push(path);
        }
    }
    files.sort();
    Ok(files)
}

/// Loads rules from `(file name, text)` pairs: the core of [`load_path`], usable in tests.
pub fn load_sources(
    sources: &[(PathBuf, String)],
    opts: LoadOptions,
) -> Result<RuleSet, RulesError> {
    let mut set = RuleSet::default();
    let mut errors = Vec::new();
    for (file, text) in sources {
        set.files.push(file.clone());
        let mut cx = Cx {
            file,
            opts,
            errors: &mut errors,
            warnings: &mut set.warnings,
        };
        let Some(domain) = cx.file_rules(text) else {
            continue;
        };
        if let Some(first) = set.domains.get(&*domain.name) {
            cx.error(
                domain.origin_pos(),
                "domain",
                format!(
                    "domain '{}' is already defined in {} (each domain lives in one file)",
                    domain.name, first.origin
                ),
            );
            continue;
        }
        set.domains.insert(domain.name.to_string(), domain);
    }
    if errors.is_empty() {
        Ok(set)
    } else {
        Err(RulesError { errors })
    }
}

impl Domain {
    fn origin_pos(&self) -> Pos {
        Pos {
            line: self.origin.line,
            col: 1,
        }
    }
}

/// The state of one file's walk: where we are and what went wrong so far.
struct Cx<'a> {
    file: &'a Path,
    opts: LoadOptions,
    errors: &'a mut Vec<RuleError>,
    warnings: &'a mut Vec<String>,
}

impl Cx<'_> {
    fn error(&mut self, pos: Pos, field: &str, message: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.to_path_buf(),
            line: pos.line,
            col: pos.col,
            field: field.to_string(),
            message: message.into(),
        });
    }

    fn origin(&self, pos: Pos) -> Origin {
        Origin {
            file: self.file.to_path_buf(),
            line: pos.line,
        }
    }

    fn file_rules(&mut self, text: &str) -> Option<Domain> {
        let root = match yaml::parse(text) {
            Ok(Some(root)) => root,
            Ok(None) => {
                self.error(
                    Pos { line: 1, col: 1 },
                    "",
                    "the file is empty: expected `domain` and `descriptors`",
                );
                return None;
            }
            Err(e) => {
                self.error(e.pos, "", format!("invalid YAML: {}", e.message));
                return None;
            }
        };
        let fields = self.fields(&root, "", &["domain", "descriptors"])?;
        let domain = match fields.get("domain") {
            None => {
                self.error(
                    root.pos,
                    "domain",
                    "missing: every rules file names its domain",
                );
                None
            }
            Some(node) => match self.string(node, "domain") {
                Some(s) if s.is_empty() => {
                    self.error(node.pos, "domain", "must not be empty");
                    None
                }
                other => other.map(|s| (s, node.pos)),
            },
        };
        let level = match fields.get("descriptors") {
            Some(node) => self.level(node, "descriptors", "")?,
            None => Level::default(),
        };
        let (name, pos) = domain?;
        Some(Domain {
            name: name.into(),
            root: level,
            origin: self.origin(pos),
        })
    }

    /// A mapping's fields by name; unknown and repeated fields are errors.
    fn fields<'n>(
        &mut self,
        node: &'n Node,
        path: &str,
        allowed: &[&str],
    ) -> Option<HashMap<&'n str, &'n Node>> {
        let Value::Map(pairs) = &node.value else {
            let what = if path.is_empty() { "the file" } else { path };
            self.error(
                node.pos,
                path,
                format!("{what} must be a mapping, found {}", node.kind()),
            );
            return None;
        };
        let mut out: HashMap<&str, &Node> = HashMap::new();
        for (k, v) in pairs {
            let Value::Scalar { text, .. } = &k.value else {
                self.error(k.pos, path, "field names must be plain strings");
                continue;
            };
            let field = join(path, text);
            if !allowed.contains(&text.as_str()) {
                self.error(
                    k.pos,
                    &field,
                    format!("unknown field (expected one of: {})", allowed.join(", ")),
                );
            } else if out.insert(text.as_str(), v).is_some() {
                self.error(k.pos, &field, "field given twice");
            }
        }
        Some(out)
    }

    fn string(&mut self, node: &Node, field: &str) -> Option<String> {
        match &node.value {
            Value::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
            _ => {
                self.error(
                    node.pos,
                    field,
                    format!("expected a string, found {}", node.kind()),
                );
                None
            }
        }
    }

    fn bool(&mut self, node: &Node, field: &str) -> Option<bool> {
        if let Value::Scalar {
            text,
            quoted: false,
        } = &node.value
        {
            if text.eq_ignore_ascii_case("true") {
                return Some(true);
            }
            if text.eq_ignore_ascii_case("false") {
                return Some(false);
            }
        }
        self.error(node.pos, field, "expected true or false");
        None
    }

    fn uint(&mut self, node: &Node, field: &str, max: u64) -> Option<u64> {
        let Value::Scalar {
            text,
            quoted: false,
        } = &node.value
        else {
            self.error(
                node.pos,
                field,
                format!("expected a whole number, found {}", node.kind()),
            );
            return None;
        };
        if text.starts_with('-') && text[1..].chars().all(|c| c.is_ascii_digit()) && text.len() > 1
        {
            self.error(
                node.pos,
                field,
                format!("must not be negative (found {text})"),
            );
            return None;
        }
        match text.parse::<u64>() {
            Ok(n) if n <= max => Some(n),
            Ok(n) => {
                self.error(node.pos, field, format!("{n} is too large (at most {max})"));
                None
            }
            Err(_) => {
                self.error(
                    node.pos,
                    field,
                    format!("expected a whole number, found '{text}'"),
                );
                None
            }
        }
    }

    fn seq<'n>(&mut self, node: &'n Node, field: &str) -> Option<&'n [Node]> {
        match &node.value {
            Value::Seq(items) => Some(items),
            _ if node.is_null() => Some(&[]),
            _ => {
                self.error(
                    node.pos,
                    field,
                    format!("expected a list, found {}", node.kind()),
                );
                None
            }
        }
    }

    /// A `descriptors:` list → one level of the tree.
    fn level(&mut self, node: &Node, path: &str, key_path: &str) -> Option<Level> {
        let items = self.seq(node, path)?;
        let mut level = Level::default();
        let mut seen: HashMap<(String, Option<String>), usize> = HashMap::new();
        let mut ok = true;
        for (i, item) in items.iter().enumerate() {
            let field = format!("{path}[{i}]");
            let Some(d) = self.descriptor(item, &field, key_path) else {
                ok = false;
                continue;
            };
            let id = (d.key.clone(), d.value.clone());
            if let Some(first) = seen.get(&id) {
                let shown = match &d.value {
                    Some(v) => format!("key '{}' with value '{v}'", d.key),
                    None => format!("key '{}' without a value", d.key),
                };
                self.error(
                    item.pos,
                    &field,
                    format!("duplicate descriptor: {shown} is already declared at line {first}"),
                );
                ok = false;
                continue;
            }
            seen.insert(id, item.pos.line);
            let d = Arc::new(d);
            match &d.value {
                None => {
                    level.bare.insert(d.key.clone(), d);
                }
                Some(v) if v.contains('*') => level.wildcard.push((d.key.clone(), v.clone(), d)),
                Some(v) => {
                    level
                        .exact
                        .entry(d.key.clone())
                        .or_default()
                        .insert(v.clone(), d);
                }
            }
        }
        ok.then_some(level)
    }

    fn descriptor(&mut self, node: &Node, path: &str, parent_keys: &str) -> Option<Descriptor> {
        const FIELDS: &[&str] = &[
            "key",
            "value",
            "rate_limit",
            "rate_limits",
            "descriptors",
            "shadow_mode",
            "share_threshold",
            "detailed_metric",
            "quota_mode",
            "value_to_metric",
            "metadata",
        ];
        let f = self.fields(node, path, FIELDS)?;
        let mut ok = true;
        let key = match f.get("key") {
            None => {
                self.error(
                    node.pos,
                    &join(path, "key"),
                    "missing: every descriptor has a key",
                );
                None
            }
            Some(n) => match self.string(n, &join(path, "key")) {
                Some(k) if k.is_empty() => {
                    self.error(n.pos, &join(path, "key"), "must not be empty");
                    None
                }
                other => other,
            },
        };
        // An empty value is the same as no value, as in the reference.
        let value = match f.get("value") {
            Some(n) if !n.is_null() => self
                .string(n, &join(path, "value"))
                .filter(|v| !v.is_empty()),
            _ => None,
        };
        let mut flag = |cx: &mut Self, name: &str| match f.get(name) {
            Some(n) => cx.bool(n, &join(path, name)).unwrap_or_else(|| {
                ok = false;
                false
            }),
            None => false,
        };
        let shadow_mode = flag(self, "shadow_mode");
        let share_threshold = flag(self, "share_threshold");
        let detailed_metric = flag(self, "detailed_metric");
        for ignored in ["quota_mode", "value_to_metric", "metadata"] {
            if let Some(n) = f.get(ignored) {
                self.warnings.push(format!(
                    "{}:{}: {}: accepted for compatibility with envoyproxy/ratelimit but not acted on",
                    self.file.display(),
                    n.pos.line,
                    join(path, ignored)
                ));
            }
        }
        let key = key?;
        let key_path = if parent_keys.is_empty() {
            key.clone()
        } else {
            format!("{parent_keys}.{key}")
        };
        if share_threshold
            && !value.as_deref().is_some_and(|v| v.contains('*'))
            && let Some(n) = f.get("share_threshold")
        {
            self.error(
                n.pos,
                &join(path, "share_threshold"),
                "only applies to a wildcard `value` (one containing `*`)",
            );
            ok = false;
        }
        let mut limits = Vec::new();
        match (f.get("rate_limit"), f.get("rate_limits")) {
            (Some(_), Some(n)) => {
                self.error(
                    n.pos,
                    &join(path, "rate_limits"),
                    "use either `rate_limit` or `rate_limits`, not both",
                );
                ok = false;
            }
            (Some(n), None) => match self.limit(
                n,
                &join(path, "rate_limit"),
                0,
                (shadow_mode, detailed_metric),
                &key_path,
            ) {
                Some(l) => limits.push(Arc::new(l)),
                None => ok = false,
            },
            (None, Some(n)) => {
                let items = self.seq(n, &join(path, "rate_limits")).unwrap_or(&[]);
                for (i, item) in items.iter().enumerate() {
                    match self.limit(
                        item,
                        &format!("{path}.rate_limits[{i}]"),
                        i,
                        (shadow_mode, detailed_metric),
                        &key_path,
                    ) {
                        Some(l) => limits.push(Arc::new(l)),
                        None => ok = false,
                    }
                }
            }
            (None, None) => {}
        }
        let children = match f.get("descriptors") {
            Some(n) => self.level(n, &join(path, "descriptors"), &key_path),
            None => Some(Level::default()),
        };
        let children = children?;
        ok.then(|| Descriptor {
            key,
            value,
            limits,
            share_threshold,
            detailed_metric,
            children,
            origin: self.origin(node.pos),
        })
    }

    fn limit(
        &mut self,
        node: &Node,
        path: &str,
        index: usize,
        flags: (bool, bool),
        key_path: &str,
    ) -> Option<Limit> {
        let (shadow_mode, detailed_metric) = flags;
        const FIELDS: &[&str] = &[
            "unit",
            "requests_per_unit",
            "unlimited",
            "name",
            "replaces",
            "algorithm",
            "burst",
            "unit_multiplier",
            "class",
            "quota_mode",
        ];
        let f = self.fields(node, path, FIELDS)?;
        let errors_before = self.errors.len();
        let unlimited = f
            .get("unlimited")
            .and_then(|n| self.bool(n, &join(path, "unlimited")))
            .unwrap_or(false);
        let name = f
            .get("name")
            .and_then(|n| self.string(n, &join(path, "name")))
            .filter(|s| !s.is_empty());
        let class = f
            .get("class")
            .and_then(|n| self.string(n, &join(path, "class")));
        if let Some(n) = f.get("class")
            && class.as_deref() == Some("")
        {
            self.error(n.pos, &join(path, "class"), "must not be empty");
        }
        if let Some(n) = f.get("quota_mode") {
            self.warnings.push(format!(
                "{}:{}: {}: accepted for compatibility with envoyproxy/ratelimit but not acted on",
                self.file.display(),
                n.pos.line,
                join(path, "quota_mode")
            ));
        }
        let mut replaces = Vec::new();
        if let Some(n) = f.get("replaces") {
            let field = join(path, "replaces");
            for (i, item) in self.seq(n, &field).unwrap_or(&[]).iter().enumerate() {
                let item_path = format!("{field}[{i}]");
                let Some(rf) = self.fields(item, &item_path, &["name"]) else {
                    continue;
                };
                let replaced = rf
                    .get("name")
                    .and_then(|n| self.string(n, &join(&item_path, "name")));
                match replaced {
                    Some(r) if r.is_empty() => self.error(
                        item.pos,
                        &item_path,
                        "a replaces entry needs a non-empty name",
                    ),
                    None if !rf.contains_key("name") => self.error(
                        item.pos,
                        &item_path,
                        "a replaces entry needs a non-empty name",
                    ),
                    Some(r) if Some(&r) == name.as_ref() => self.error(
                        item.pos,
                        &item_path,
                        format!("a limit cannot replace itself ('{r}')"),
                    ),
                    Some(r) => replaces.push(r),
                    None => {}
                }
            }
        }
        let rate = if unlimited {
            if let Some(n) = f.get("unit") {
                self.error(
                    n.pos,
                    &join(path, "unit"),
                    "must not be set when `unlimited: true`",
                );
            }
            None
        } else {
            self.rate(node, path, &f)
        };
        if self.errors.len() > errors_before {
            return None;
        }
        Some(Limit {
            class: class
                .or_else(|| name.clone())
                .unwrap_or_else(|| key_path.to_string())
                .into(),
            name,
            rate,
            shadow_mode,
            detailed_metric,
            replaces,
            index,
            origin: self.origin(node.pos),
        })
    }

    fn rate(&mut self, node: &Node, path: &str, f: &HashMap<&str, &Node>) -> Option<Rate> {
        let unit = match f.get("unit") {
            None => {
                self.error(
                    node.pos,
                    &join(path, "unit"),
                    "missing (second, minute, hour, day, week, month or year)",
                );
                None
            }
            Some(n) => {
                let s = self.string(n, &join(path, "unit"))?;
                let unit = Unit::parse(&s);
                if unit.is_none() {
                    self.error(
                        n.pos,
                        &join(path, "unit"),
                        format!("unknown unit '{s}' (expected second, minute, hour, day, week, month or year)"),
                    );
                }
                unit
            }
        };
        let rpu = match f.get("requests_per_unit") {
            None => {
                self.error(
                    node.pos,
                    &join(path, "requests_per_unit"),
                    "missing (or set `unlimited: true`)",
                );
                None
            }
            Some(n) => self.uint(n, &join(path, "requests_per_unit"), u64::from(u32::MAX)),
        };
        let algorithm = match f.get("algorithm") {
            None => Some(self.opts.default_algorithm),
            Some(n) => {
                let s = self.string(n, &join(path, "algorithm"))?;
                let a = Algorithm::parse(&s);
                if a.is_none() {
                    self.error(
                        n.pos,
                        &join(path, "algorithm"),
                        format!("unknown algorithm '{s}' (expected {})", Algorithm::NAMES),
                    );
                }
                a
            }
        };
        let positive = |cx: &mut Self, name: &str, max: u64| -> Option<Option<u64>> {
            let Some(n) = f.get(name) else {
                return Some(None);
            };
            let v = cx.uint(n, &join(path, name), max)?;
            if v == 0 {
                cx.error(n.pos, &join(path, name), "must be at least 1");
                return None;
            }
            Some(Some(v))
        };
        let burst = positive(self, "burst", u64::from(u32::MAX));
        let multiplier = positive(self, "unit_multiplier", 1_000_000);
        let (unit, rpu, algorithm, burst, multiplier) =
            (unit?, rpu?, algorithm?, burst?, multiplier?);
        if burst.is_some()
            && algorithm != Algorithm::TokenBucket
            && let Some(n) = f.get("burst")
        {
            self.error(
                n.pos,
                &join(path, "burst"),
                "only applies to algorithm token_bucket",
            );
            return None;
        }
        // A bucket that never refills is dropped once idle and would come back full: with no
        // refill there is nothing a burst could mean but "a few, now and then". Refuse it.
        if rpu == 0
            && burst.is_some()
            && let Some(n) = f.get("burst")
        {
            self.error(
                n.pos,
                &join(path, "burst"),
                "needs requests_per_unit above 0 (0 denies everything)",
            );
            return None;
        }
        Some(Rate {
            requests_per_unit: rpu as u32,
            unit,
            unit_multiplier: multiplier.unwrap_or(1) as u32,
            burst: burst.unwrap_or(rpu),
            algorithm,
        })
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<RuleSet, RulesError> {
        load_sources(
            &[(PathBuf::from("r.yaml"), text.to_string())],
            LoadOptions::default(),
        )
    }

    /// The single error of a refused file, as `line: field: message`.
    fn refused(text: &str) -> (usize, String, String) {
        let err = load(text).expect_err("should be refused");
        assert_eq!(err.errors.len(), 1, "{err}");
        let e = &err.errors[0];
        (e.line, e.field.clone(), e.message.clone())
    }

    #[test]
    fn loads_reference_shaped_rules() {
        let set = load(
            "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: Minute\n      requests_per_unit: 100\n    descriptors:\n      - key: endpoint\n        value: /search\n        rate_limit: {unit: second, requests_per_unit: 5, name: search}\n  - key: path\n    value: /api/*\n    shadow_mode: true\n    rate_limit: {unlimited: true}\n",
        )
        .unwrap();
        let d = &set.domains["edge"];
        let tenant = &d.root.bare["tenant"];
        let rate = tenant.limits[0].rate.unwrap();
        assert_eq!(
            (rate.requests_per_unit, rate.unit, rate.burst),
            (100, Unit::Minute, 100)
        );
        assert_eq!(&*tenant.limits[0].class, "tenant");
        let ep = &tenant.children.exact["endpoint"]["/search"];
        assert_eq!(&*ep.limits[0].class, "search");
        assert_eq!(ep.origin.line, 8);
        assert_eq!(d.root.wildcard[0].1, "/api/*");
        assert!(d.root.wildcard[0].2.limits[0].rate.is_none());
        assert_eq!(set.counts(), (1, 3, 3));
    }

    #[test]
    fn extensions_resolve_defaults() {
        let set = load(
            "domain: d\ndescriptors:\n  - key: k\n    rate_limits:\n      - {unit: second, requests_per_unit: 10, burst: 20, class: burst}\n      - {unit: minute, requests_per_unit: 0, unit_multiplier: 5, algorithm: fixed_window}\n      - {unit: hour, requests_per_unit: 7, algorithm: sliding_window}\n",
        )
        .unwrap();
        let k = &set.domains["d"].root.bare["k"];
        let (a, b) = (k.limits[0].rate.unwrap(), k.limits[1].rate.unwrap());
        assert_eq!(
            (a.burst, a.algorithm, &*k.limits[0].class),
            (20, Algorithm::TokenBucket, "burst")
        );
        assert_eq!(
            (b.window_ms(), b.algorithm, k.limits[1].index),
            (300_000, Algorithm::FixedWindow, 1)
        );
        let c = k.limits[2].rate.unwrap();
        assert_eq!(
            (c.window_ms(), c.algorithm, c.requests_per_unit),
            (3_600_000, Algorithm::SlidingWindow, 7)
        );
    }

    #[test]
    fn default_algorithm_applies_to_limits_without_one() {
        let src = [(PathBuf::from("r.yaml"), "domain: d\ndescriptors:\n  - key: k\n    rate_limit: {unit: second, requests_per_unit: 1}\n".to_string())];
        let set = load_sources(
            &src,
            LoadOptions {
                default_algorithm: Algorithm::FixedWindow,
            },
        )
        .unwrap();
        assert_eq!(
            set.domains["d"].root.bare["k"].limits[0]
                .rate
                .unwrap()
                .algorithm,
            Algorithm::FixedWindow
        );
    }

    #[test]
    fn refuses_bad_yaml_with_its_line() {
        let (line, _, msg) = refused("domain: d\ndescriptors:\n  - key: a\n    value: [unclosed\n");
        assert!(line >= 4, "{line}");
        assert!(msg.starts_with("invalid YAML"), "{msg}");
    }

    #[test]
    fn refuses_unknown_fields_at_their_line() {
        let (line, field, msg) = refused(
            "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      request_per_unit: 2\n",
        );
        assert_eq!(
            (line, field.as_str()),
            (7, "descriptors[0].rate_limit.request_per_unit")
        );
        assert!(msg.contains("unknown field"), "{msg}");
        assert_eq!(refused("domain: d\nextra: 1\n").0, 2);
    }

    #[test]
    fn refuses_bad_units_and_counts() {
        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n";
        let (line, field, msg) = refused(&format!(
            "{base}      unit: minutes\n      requests_per_unit: 1\n"
        ));
        assert_eq!(
            (line, field.as_str()),
            (5, "descriptors[0].rate_limit.unit")
        );
        assert!(msg.contains("unknown unit 'minutes'"), "{msg}");
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: -5\n"
        ));
        assert_eq!(line, 6);
        assert!(msg.contains("negative"), "{msg}");
        let (line, field, msg) = refused(&format!("{base}      unit: second\n"));
        assert_eq!(
            (line, field.as_str()),
            (5, "descriptors[0].rate_limit.requests_per_unit")
        );
        assert!(msg.contains("missing"), "{msg}");
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 4294967296\n"
        ));
        assert_eq!(line, 6);
        assert!(msg.contains("too large"), "{msg}");
        let (line, _, _) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: ten\n"
        ));
        assert_eq!(line, 6);
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 0\n      burst: 5\n"
        ));
        assert_eq!(line, 7);
        assert!(msg.contains("requests_per_unit above 0"), "{msg}");
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      burst: 0\n"
        ));
        assert_eq!(line, 7);
        assert!(msg.contains("at least 1"), "{msg}");
        // `burst` is a token-bucket capacity: a window algorithm refuses it.
        for algorithm in ["fixed_window", "sliding_window"] {
            let (line, field, msg) = refused(&format!(
                "{base}      unit: second\n      requests_per_unit: 1\n      algorithm: {algorithm}\n      burst: 5\n"
            ));
            assert_eq!(
                (line, field.as_str()),
                (8, "descriptors[0].rate_limit.burst")
            );
            assert!(msg.contains("token_bucket"), "{msg}");
        }
        let (line, _, msg) = refused(&format!(
            "{base}      unit: second\n      requests_per_unit: 1\n      algorithm: leaky_bucket\n"
        ));
        assert_eq!(line, 7);
        assert!(
            msg.contains("expected token_bucket, fixed_window or sliding_window"),
            "{msg}"
        );
        // `unlimited` needs no requests_per_unit but refuses a unit.
        assert!(load(&format!("{base}      unlimited: true\n")).is_ok());
        let (line, field, msg) = refused(&format!(
            "{base}      unlimited: true\n      unit: second\n"
        ));
        assert_eq!(
            (line, field.as_str()),
            (6, "descriptors[0].rate_limit.unit")
        );
        assert!(msg.contains("unlimited"), "{msg}");
    }

    #[test]
    fn refuses_empty_domain_and_key() {
        let (line, field, msg) = refused("domain: \"\"\ndescriptors: []\n");
        assert_eq!(
            (line, field.as_str(), msg.as_str()),
            (1, "domain", "must not be empty")
        );
        let (line, field, _) = refused("descriptors: []\n");
        assert_eq!((line, field.as_str()), (1, "domain"));
        let (line, field, msg) = refused("domain: d\ndescriptors:\n  - key: \"\"\n");
        assert_eq!(
            (line, field.as_str(), msg.as_str()),
            (3, "descriptors[0].key", "must not be empty")
        );
        let (line, _, _) = refused("domain: d\ndescriptors:\n  - value: x\n");
        assert_eq!(line, 3);
        let (line, _, msg) = refused("");
        assert_eq!(line, 1);
        assert!(msg.contains("empty"));
    }

    #[test]
    fn refuses_duplicate_keys_at_one_level() {
        let (line, field, msg) = refused(
            "domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: b\n  - key: a\n    value: x\n",
        );
        assert_eq!((line, field.as_str()), (6, "descriptors[2]"));
        assert!(msg.contains("line 3"), "{msg}");
        // Same key with different values, or at different levels, is fine.
        assert!(load("domain: d\ndescriptors:\n  - key: a\n    value: x\n  - key: a\n  - key: b\n    descriptors:\n      - key: a\n").is_ok());
    }

    #[test]
    fn refuses_bad_replaces() {
        let base = "domain: d\ndescriptors:\n  - key: a\n    rate_limit:\n      unit: second\n      requests_per_unit: 1\n      name: one\n      replaces:\n";
        let (line, _, msg) = refused(&format!("{base}        - name: one\n"));
        assert_eq!(line, 9);
        assert!(msg.contains("itself"), "{msg}");
        let (line, _, msg) = refused(&format!("{base}        - name: \"\"\n"));
        assert_eq!(line, 9);
        assert!(msg.contains("non-empty"), "{msg}");
        let (line, _, _) = refused(&format!("{base}        - {{}}\n"));
        assert_eq!(line, 9);
    }

    #[test]
    fn refuses_duplicate_domains_across_files() {
        let a = (PathBuf::from("a.yaml"), "domain: d\n".to_string());
        let b = (PathBuf::from("b.yaml"), "# b\ndomain: d\n".to_string());
        let err = load_sources(&[a, b], LoadOptions::default()).unwrap_err();
        assert_eq!(err.errors.len(), 1);
        let e = &err.errors[0];
        assert_eq!((e.file.to_str(), e.line), (Some("b.yaml"), 2));
        assert!(e.message.contains("a.yaml:1"), "{}", e.message);
    }

    #[test]
    fn collects_every_error_and_warns_about_ignored_fields() {
        let err = load("domain: d\ndescriptors:\n  - key: a\n    rate_limit: {unit: eon, requests_per_unit: 1}\n  - key: b\n    bogus: 1\n").unwrap_err();
        assert_eq!(err.errors.len(), 2, "{err}");
        assert!(err.to_string().contains("r.yaml:4:"), "{err}");
        let set = load("domain: d\ndescriptors:\n  - key: a\n    value_to_metric: true\n").unwrap();
        assert_eq!(set.warnings.len(), 1);
        assert!(
            set.warnings[0].starts_with("r.yaml:4:"),
            "{:?}",
            set.warnings
        );
    }

    #[test]
    fn loads_a_directory_like_a_configmap_mount() {
        let dir = std::env::temp_dir().join(format!("tollgate-rules-{}", std::process::id()));
        let data = dir.join("..data");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("a.yaml"), "domain: a\n").unwrap();
        std::fs::write(dir.join(".hidden.yaml"), "not: [valid\n").unwrap();
        std::fs::write(dir.join("notes.txt"), "ignored").unwrap();
        std::fs::write(dir.join("b.yml"), "domain: b\n").unwrap();
        #[cfg(unix)]
        std::os::unix::fs::symlink(data.join("a.yaml"), dir.join("a.yaml")).unwrap();
        let set = load_path(&dir, LoadOptions::default()).unwrap();
        let mut names: Vec<_> = set.domains.keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["a", "b"]);
        std::fs::remove_dir_all(&dir).unwrap();
        let missing = load_path(&dir, LoadOptions::default()).unwrap_err();
        assert!(
            missing.to_string().contains("cannot read the rules path"),
            "{missing}"
        );
    }
}
