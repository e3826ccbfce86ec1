//! Loading the rules path: a file or a directory of files → one validated [`RuleSet`].
//!
//! The rules path is a `*.yaml`/`*.yml` file or a directory tree of them, walked as the
//! reference's runtime loader does (subdirectories too; dot entries and links to directories
//! skipped, so a Kubernetes ConfigMap mount loads each file once). [`load_path`] reads every file; [`load_sources`] walks each one (`validate/`),
//! refuses a domain declared in two files, and gathers every file's errors into one
//! [`RulesError`] (each `file:line:col: field: message`, so one run of `tollgate check` lists
//! them all) and their warnings into [`RuleSet::warnings`] (where a directory without any
//! rules file is reported too). The same code runs at startup and on reload.

use std::path::{Path, PathBuf};

use super::error::Pos;
use super::error::{Problems, RuleError, RulesError};
use super::model::{LoadOptions, RuleSet};
use super::validate;

/// Loads and validates every rules file under `path`.
pub fn load_path(path: &Path, opts: LoadOptions) -> Result<RuleSet, RulesError> {
    let fail = |message: String| RulesError {
        errors: vec![RuleError::whole_file(path, message)],
    };
    let meta =
        std::fs::metadata(path).map_err(|e| fail(format!("cannot read the rules path: {e}")))?;
    let (files, unreadable) = if meta.is_dir() {
        let listing =
            list_dir(path).map_err(|e| fail(format!("cannot list the rules directory: {e}")))?;
        (listing.files, listing.unreadable)
    } else {
        (vec![path.to_path_buf()], Vec::new())
    };
    let empty_dir = meta.is_dir() && files.is_empty();
    let mut sources = Vec::with_capacity(files.len());
    let mut errors = Vec::new();
    for file in files {
        match std::fs::read_to_string(&file) {
            Ok(text) => sources.push((file, text)),
            Err(e) => errors.push(RuleError::whole_file(&file, format!("cannot read: {e}"))),
        }
    }
    match load_sources(&sources, opts) {
        Ok(mut set) if errors.is_empty() => {
            // As the reference's loader: a subdirectory it cannot list is passed over, said.
            for (dir, e) in &unreadable {
                set.warnings.push(format!(
                    "{}: cannot list this subdirectory ({e}): any rules files in it are not loaded",
                    dir.display()
                ));
            }
            // Loading nothing is valid (every request is allowed) but seldom what was meant:
            // a wrong path, or files named `*.json` or `*.txt`. Say so instead of going quiet.
            if empty_dir {
                // A path one level too high is the usual mistake: name where the files are.
                let below = subdirs_with_rules(path);
                let hint = if below.is_empty() {
                    String::new()
                } else {
                    format!(
                        "; rules files are in {} (point the rules path there)",
                        below.join(", ")
                    )
                };
                set.warnings.push(format!(
                    "{}: no rules files (*.yaml, *.yml) in this directory: no domain is limited, every request is allowed{hint}",
                    path.display()
                ));
            }
            Ok(set)
        }
        Ok(_) => Err(RulesError { errors }),
        Err(mut e) => {
            errors.append(&mut e.errors);
            Err(RulesError { errors })
        }
    }
}

/// The subdirectories of `dir` (not dot-directories) that hold rules files, as `name/`, sorted.
fn subdirs_with_rules(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found: Vec<String> = entries
        .filter_map(|e| e.ok()?.path().canonicalize().ok())
        .filter(|p| p.is_dir())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| !n.starts_with('.'))
        })
        .filter(|p| list_dir(p).is_ok_and(|l| !l.files.is_empty()))
        .filter_map(|p| Some(format!("{}/", p.file_name()?.to_str()?)))
        .collect();
    found.sort();
    found
}

/// The rules files under a directory, as the reference's runtime loader walks it: every
/// `*.yaml` and `*.yml` (in any case: `EDGE.YAML` too) in the directory and its
/// subdirectories (`team-b/payments.yaml`), sorted by path. Dot entries are skipped (a
/// Kubernetes ConfigMap's `..data` and `..2026_…` directories: its files are the links beside
/// them), and so are links to directories, which are not followed (a loop, or the same files
/// twice); a link to a file is read (ConfigMap files are links into `..data/`).
pub(super) fn list_dir(dir: &Path) -> std::io::Result<Listing> {
    let mut listing = Listing::default();
    walk(dir, &mut listing, 0)?;
    listing.files.sort();
    Ok(listing)
}

/// What [`list_dir`] found.
#[derive(Debug, Default)]
pub(super) struct Listing {
    pub(super) files: Vec<PathBuf>,
    /// Subdirectories that could not be listed (a `lost+found` of another owner), and why.
    pub(super) unreadable: Vec<(PathBuf, std::io::Error)>,
}

/// Directories deeper than this are not walked (a rules tree is a few levels deep).
const MAX_DEPTH: usize = 16;

/// Lists `dir` into `out`; only the top directory's own listing failing is an error.
fn walk(dir: &Path, out: &mut Listing, depth: usize) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if depth > 0 => {
            out.unreadable.push((dir.to_path_buf(), e));
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        if name.starts_with('.') {
            continue;
        }
        // The entry itself, not what a link points at.
        let own = entry.file_type()?;
        if own.is_dir() {
            if depth < MAX_DEPTH {
                walk(&path, out, depth + 1)?;
            }
            continue;
        }
        let lower = name.to_ascii_lowercase();
        let yaml = lower.ends_with(".yaml") || lower.ends_with(".yml");
        // is_file follows a link: a link to a file is read, one to a directory is not.
        if yaml && path.is_file() {
            out.files.push(path);
        }
    }
    Ok(())
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
        let mut problems = Problems::new(file);
        if let Some(domain) = validate::file_rules(text, opts, &mut problems) {
            // A domain's rules live in one file: a second file naming it would otherwise
            // replace the first one's rules without a word.
            match set.domains.get(&*domain.name) {
                Some(first) => problems.error(
                    Pos {
                        line: domain.origin.line,
                        col: 1,
                    },
                    "domain",
                    format!(
                        "domain '{}' is already defined in {} (each domain lives in one file)",
                        domain.name, first.origin
                    ),
                ),
                None => {
                    set.domains.insert(domain.name.to_string(), domain);
                }
            }
        }
        errors.append(&mut problems.errors);
        set.warnings.append(&mut problems.warnings);
    }
    if errors.is_empty() {
        Ok(set)
    } else {
        Err(RulesError { errors })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn loads_a_directory_like_a_configmap_mount() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
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
        assert!(set.warnings.is_empty(), "{:?}", set.warnings);
        tmp.close().unwrap();
        let missing = load_path(&dir, LoadOptions::default()).unwrap_err();
        assert!(
            missing.to_string().contains("cannot read the rules path"),
            "{missing}"
        );
    }

    /// The reference's runtime loader walks the tree: `team-b/payments.yaml` is loaded. A
    /// ConfigMap mount (files linked into `..data`, itself a link to a dot directory) loads
    /// each file once, and a link to a directory is not followed (here: a loop).
    #[test]
    fn loads_subdirectories_as_the_reference_does() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("edge.yaml"), "domain: edge\n").unwrap();
        std::fs::create_dir_all(dir.join("team-b").join("deep")).unwrap();
        std::fs::write(
            dir.join("team-b").join("payments.yaml"),
            "domain: payments\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("team-b").join("deep").join("search.yml"),
            "domain: search\n",
        )
        .unwrap();
        // A ConfigMap mount below: team-c/..2026_12_05/x.yaml, ..data -> ..2026_12_05,
        // x.yaml -> ..data/x.yaml.
        let cm = dir.join("team-c");
        std::fs::create_dir_all(cm.join("..2026_12_05")).unwrap();
        std::fs::write(cm.join("..2026_12_05").join("x.yaml"), "domain: x\n").unwrap();
        std::os::unix::fs::symlink("..2026_12_05", cm.join("..data")).unwrap();
        std::os::unix::fs::symlink("..data/x.yaml", cm.join("x.yaml")).unwrap();
        std::os::unix::fs::symlink(dir, dir.join("team-b").join("loop")).unwrap();
        let set = load_path(dir, LoadOptions::default()).unwrap();
        let mut names: Vec<_> = set.domains.keys().cloned().collect();
        names.sort();
        assert_eq!(names, ["edge", "payments", "search", "x"]);
        assert_eq!(set.files.len(), 4, "{:?}", set.files);
        // Reload sees a change below too.
        let before = crate::rules::reload::fingerprint(dir);
        std::fs::write(
            dir.join("team-b").join("payments.yaml"),
            "domain: payments\n# changed\n",
        )
        .unwrap();
        assert_ne!(before, crate::rules::reload::fingerprint(dir));
    }

    /// A subdirectory that cannot be listed is passed over with a warning, not a failed load.
    #[test]
    fn an_unreadable_subdirectory_is_a_warning() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        std::fs::write(dir.join("edge.yaml"), "domain: edge\n").unwrap();
        let locked = dir.join("lost+found");
        std::fs::create_dir(&locked).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        let root_reads_anyway = std::fs::read_dir(&locked).is_ok();
        let set = load_path(dir, LoadOptions::default());
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
        let set = set.unwrap();
        assert_eq!(set.domains.len(), 1);
        // Root lists any directory: the branch itself, with a subdirectory that is gone.
        let mut listing = Listing::default();
        walk(&dir.join("gone"), &mut listing, 1).unwrap();
        assert_eq!(listing.unreadable.len(), 1);
        assert!(
            walk(&dir.join("gone"), &mut listing, 0).is_err(),
            "the top one is an error"
        );
        if !root_reads_anyway {
            assert!(
                set.warnings
                    .iter()
                    .any(|w| w.contains("lost+found: cannot list this subdirectory")),
                "{:?}",
                set.warnings
            );
        }
    }

    #[test]
    fn warns_about_a_directory_without_rules_files() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        // Neither a dotfile nor another extension counts as a rules file.
        std::fs::write(dir.join(".hidden.yaml"), "domain: h\n").unwrap();
        std::fs::write(dir.join("edge.json"), "{}").unwrap();
        let set = load_path(dir, LoadOptions::default()).unwrap();
        assert!(set.domains.is_empty() && set.files.is_empty());
        assert_eq!(
            set.warnings,
            [format!(
                "{}: no rules files (*.yaml, *.yml) in this directory: no domain is limited, every request is allowed",
                dir.display()
            )]
        );
        // The rules behind a link to a directory (not followed): the warning says where.
        let elsewhere = tempfile::tempdir().unwrap();
        let rules = elsewhere.path().join("rules");
        std::fs::create_dir(&rules).unwrap();
        std::fs::write(rules.join("edge.yaml"), "domain: edge\n").unwrap();
        std::os::unix::fs::symlink(&rules, dir.join("linked")).unwrap();
        let set = load_path(dir, LoadOptions::default()).unwrap();
        assert!(set.domains.is_empty(), "{:?}", set.domains.keys());
        assert!(
            set.warnings[0].ends_with("; rules files are in rules/ (point the rules path there)"),
            "{:?}",
            set.warnings
        );
        std::fs::remove_file(dir.join("linked")).unwrap();
        // One rules file, even one without descriptors, is not "no rules files"; the
        // extension's case does not matter.
        std::fs::write(dir.join("EDGE.YAML"), "domain: edge\n").unwrap();
        let set = load_path(dir, LoadOptions::default()).unwrap();
        assert!(set.warnings.is_empty(), "{:?}", set.warnings);
        assert_eq!(set.files.len(), 1, "{:?}", set.files);
    }

    #[test]
    fn refuses_a_second_yaml_document_at_its_line() {
        let text = "domain: a\ndescriptors: []\n---\ndomain: b\n";
        let err = load_sources(
            &[(PathBuf::from("two.yaml"), text.to_string())],
            LoadOptions::default(),
        )
        .unwrap_err();
        assert_eq!(err.errors.len(), 1, "{err}");
        let e = &err.errors[0];
        assert_eq!(e.line, 4, "{err}");
        assert!(e.message.contains("second YAML document"), "{err}");
        // A leading `---` and a trailing one without content are one document, as before.
        let one = "---\ndomain: a\n---\n";
        let set = load_sources(
            &[(PathBuf::from("one.yaml"), one.to_string())],
            LoadOptions::default(),
        )
        .unwrap();
        assert!(set.domains.contains_key("a"));
    }
}
