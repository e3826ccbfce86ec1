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

use super::load::{LoadOptions, load_path};
use super::model::RuleSet;
use crate::telemetry::{Metrics, ResultLabels};

/// Size, modification time and content hash (`None`: unreadable, e.g. a directory) of each
/// file under the rules path.
pub type Fingerprint = Vec<(PathBuf, u64, Option<SystemTime>, Option<u64>)>;

/// What identifies the current content of the rules path, cheaply.
pub fn fingerprint(path: &Path) -> Fingerprint {
    let files = match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => std::fs::read_dir(path)
            .map(|it| {
                it.filter_map(|e| e.ok().map(|e| e.path()))
                    .collect::<Vec<_>>()
            })
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

/// Polls until `shutdown` resolves; returns then. `loaded` is the fingerprint taken just
/// *before* the rules in force were read, so an edit made while the service was starting is
/// picked up at the first tick instead of being missed.
pub async fn watch(
    path: PathBuf,
    loaded: Fingerprint,
    opts: LoadOptions,
    rules: Arc<ArcSwap<RuleSet>>,
    metrics: Arc<Metrics>,
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
        reload_once(&path, opts, &rules, &metrics);
    }
}

/// Loads the rules path and swaps it in if valid. Returns whether it was swapped.
pub fn reload_once(
    path: &Path,
    opts: LoadOptions,
    rules: &ArcSwap<RuleSet>,
    metrics: &Metrics,
) -> bool {
    match load_path(path, opts) {
        Ok(set) => {
            let (domains, _, limits) = set.counts();
            tracing::info!(path = %path.display(), domains, limits, "rules reloaded");
            metrics.rules_loaded.set(limits as i64);
            metrics
                .rules_reloads
                .get_or_create(&ResultLabels { result: "ok" })
                .inc();
            rules.store(Arc::new(set));
            true
        }
        Err(e) => {
            tracing::error!(path = %path.display(), "rules not reloaded, the rules in force stay: {e}");
            metrics
                .rules_reloads
                .get_or_create(&ResultLabels { result: "error" })
                .inc();
            false
        }
    }
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
        assert!(!reload_once(&file, opts, &rules, &metrics));
        assert!(rules.load().domains.contains_key("one"));
        std::fs::write(&file, "domain: two\n").unwrap();
        assert!(reload_once(&file, opts, &rules, &metrics));
        assert!(rules.load().domains.contains_key("two"));
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
