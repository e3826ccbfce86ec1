//! Rules reload: poll the rules path, and swap a new [`RuleSet`] in when its files change.
//!
//! Polling (each file's size, modification time and a hash of its content, every
//! `reload_interval_ms`) rather than inotify, because a Kubernetes ConfigMap update swaps a
//! `..data` symlink, which file watchers miss or report twice, and polling needs no extra
//! dependency. The content hash is there because size and mtime alone miss an edit that keeps
//! the size within one mtime tick (a changed digit, two lines swapped; coarse-mtime
//! filesystems make the tick a second or more). Rules files are a few KB, so reading them each
//! poll is cheap. A new set that fails to load is logged with every error and counted; the
//! rules in force stay.

use std::hash::{DefaultHasher, Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use arc_swap::ArcSwap;

use super::load::load_path;
use super::model::LoadOptions;
use super::model::RuleSet;
use crate::telemetry::{Metrics, ResultLabels};

/// What `/readyz` and `/config` say about the rules: when the rules in force were loaded, and
/// the last reload that failed since then (a good reload clears it), so a broken edit on disk
/// is visible without reading the log.
#[derive(Debug, Default)]
pub struct ReloadStatus {
    inner: std::sync::Mutex<StatusView>,
}

/// A copy of [`ReloadStatus`] (times in Unix ms).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StatusView {
    pub loaded_at_ms: u64,
    /// When the last failed reload was tried, and its error (every problem, with file:line).
    pub failed: Option<(u64, String)>,
    /// The xDS version of the rules in force (`xds.rs`); `None` for rules from files.
    pub version: Option<String>,
}

impl ReloadStatus {
    /// The rules in force were loaded just now.
    pub fn loaded(&self) {
        let mut s = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        s.loaded_at_ms = unix_ms();
        s.failed = None;
    }

    /// The rules in force (loaded just now) are this xDS version.
    pub fn version(&self, version: &str) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).version = Some(version.to_string());
    }

    /// A reload failed just now with `error`; the rules in force stay.
    pub fn failed(&self, error: String) {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).failed = Some((unix_ms(), error));
    }

    pub fn view(&self) -> StatusView {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// Wall-clock time for the status only (what an operator compares with the files' times).
fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Size, modification time and content hash (`None`: unreadable, e.g. a directory) of each
/// file under the rules path.
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>, Option<u64>)>;

/// What identifies the current content of the rules path, cheaply.
pub fn fingerprint(path: &Path) -> Fingerprint {
    let files = match std::fs::metadata(path) {
        // The files a load reads, subdirectories included.
        Ok(m) if m.is_dir() => super::load::list_dir(path)
            .map(|l| l.files)
            .unwrap_or_default(),
        _ => vec![path.to_path_buf()],
    };
    let mut out: Vec<_> = files
        .into_iter()
        .filter_map(|f| {
            // metadata() follows symlinks: a ConfigMap update changes the target's mtime.
            let m = std::fs::metadata(&f).ok()?;
            let content = std::fs::read(&f).ok().map(|bytes| {
                let mut h = DefaultHasher::new();
                bytes.hash(&mut h);
                h.finish()
            });
            Some((f, m.len(), m.modified().ok(), content))
        })
        .collect();
    out.sort();
    out
}

/// What a reload updates: the rules in force, the reload counters, the status the admin port
/// shows.
pub struct Reloaded {
    pub rules: Arc<ArcSwap<RuleSet>>,
    pub metrics: Arc<Metrics>,
    pub status: Arc<ReloadStatus>,
}

/// Polls until `shutdown` resolves; returns then. `loaded` is the fingerprint taken just
/// *before* the rules in force were read, so an edit made while the service was starting is
/// picked up at the first tick instead of being missed.
pub async fn watch(
    path: PathBuf,
    loaded: Fingerprint,
    opts: LoadOptions,
    into: Reloaded,
    interval: Duration,
    shutdown: impl std::future::Future<Output = ()>,
) {
    tokio::pin!(shutdown);
    let mut last = loaded;
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut shutdown => return,
            _ = tick.tick() => {}
        }
        let now = fingerprint(&path);
        if now == last {
            continue;
        }
        last = now;
        reload_once(&path, opts, &into.rules, &into.metrics, &into.status);
    }
}

/// Loads the rules path and swaps it in if valid (noted in `status` either way). Returns
/// whether it was swapped.
pub fn reload_once(
    path: &Path,
    opts: LoadOptions,
    rules: &ArcSwap<RuleSet>,
    metrics: &Metrics,
    status: &ReloadStatus,
) -> bool {
    match load_path(path, opts) {
        Ok(set) => {
            swap_in(set, &path.display().to_string(), rules, metrics, status);
            true
        }
        Err(e) => {
            refuse(&path.display().to_string(), &e.to_string(), metrics, status);
            false
        }
    }
}

/// Keeps the rules in force after a new set from `source` failed to load with `error`:
/// logged, counted and noted in the status.
pub fn refuse(source: &str, error: &str, metrics: &Metrics, status: &ReloadStatus) {
    tracing::error!(
        source,
        "rules not reloaded, the rules in force stay: {error}"
    );
    status.failed(error.to_string());
    metrics
        .rules_reloads
        .get_or_create(&ResultLabels { result: "error" })
        .inc();
}

/// Puts a validated `set` in force (from `source`: a path, or an xDS version), counted and
/// noted in the status.
pub fn swap_in(
    set: RuleSet,
    source: &str,
    rules: &ArcSwap<RuleSet>,
    metrics: &Metrics,
    status: &ReloadStatus,
) {
    let (domains, _, limits) = set.counts();
    tracing::info!(source, domains, limits, "rules reloaded");
    metrics.rules_loaded.set(limits as i64);
    metrics
        .rules_reloads
        .get_or_create(&ResultLabels { result: "ok" })
        .inc();
    rules.store(Arc::new(set));
    status.loaded();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_reload_keeps_the_rules_in_force() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.yaml");
        std::fs::write(&file, "domain: one\n").unwrap();
        let opts = LoadOptions::default();
        let rules = ArcSwap::from_pointee(load_path(&file, opts).unwrap());
        let metrics = Metrics::new();
        let before = fingerprint(&file);
        std::fs::write(&file, "domain: two\nextra: field\n").unwrap();
        assert_ne!(fingerprint(&file), before);
        let status = ReloadStatus::default();
        status.loaded();
        let loaded_at = status.view().loaded_at_ms;
        assert!(!reload_once(&file, opts, &rules, &metrics, &status));
        assert!(rules.load().domains.contains_key("one"));
        // The failure is kept, with the file and line, and the rules in force keep their time.
        let view = status.view();
        let (_, error) = view.failed.clone().expect("the failure is kept");
        assert!(
            error.contains("r.yaml:2") && error.contains("extra"),
            "{error}"
        );
        assert_eq!(view.loaded_at_ms, loaded_at);
        std::fs::write(&file, "domain: two\n").unwrap();
        assert!(reload_once(&file, opts, &rules, &metrics, &status));
        assert!(rules.load().domains.contains_key("two"));
        assert_eq!(status.view().failed, None, "a good reload clears it");
    }

    /// An edit that keeps the size and the modification time (a changed digit within one
    /// mtime tick) is still a change.
    #[test]
    fn a_same_size_edit_within_one_mtime_tick_changes_the_fingerprint() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("r.yaml");
        std::fs::write(&file, "requests_per_unit: 5\n").unwrap();
        let mtime = std::fs::metadata(&file).unwrap().modified().unwrap();
        let before = fingerprint(dir.path());
        std::fs::write(&file, "requests_per_unit: 6\n").unwrap();
        std::fs::File::options()
            .write(true)
            .open(&file)
            .unwrap()
            .set_modified(mtime)
            .unwrap();
        let after = fingerprint(dir.path());
        assert_eq!(
            (after[0].1, after[0].2),
            (before[0].1, before[0].2),
            "same size and mtime"
        );
        assert_ne!(after, before, "the content changed");
    }
}
