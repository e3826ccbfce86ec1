//! Loading the rules path: a file or a directory of files → one validated [`RuleSet`].
//!
//! The rules path is a `*.yaml`/`*.yml` file or a directory of them (not recursive; dotfiles
//! and dot-directories are skipped, so the `..data` links of a Kubernetes ConfigMap mount
//! work). [`load_path`] reads every file; [`load_sources`] walks each one (`validate/`),
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
    let files = if meta.is_dir() {
        list_dir(path).map_err(|e| fail(format!("cannot list the rules directory: {e}")))?
    } else {
        vec![path.to_path_buf()]
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
        .filter(|p| list_dir(p).is_ok_and(|files| !files.is_empty()))
        .filter_map(|p| Some(format!("{}/", p.file_name()?.to_str()?)))
        .collect();
    found.sort();
    found
}

/// The rules files in a directory: `*.yaml` and `*.yml` (in any case: `EDGE.YAML` too), no
/// dotfiles, sorted by name.
fn list_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let lower = name.to_ascii_lowercase();
        let yaml = lower.ends_with(".yaml") || lower.ends_with(".yml");
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
        // The rules one level down: the warning says where they are.
        std::fs::create_dir(dir.join("rules")).unwrap();
        std::fs::write(dir.join("rules").join("edge.yaml"), "domain: edge\n").unwrap();
        let set = load_path(dir, LoadOptions::default()).unwrap();
        assert!(
            set.warnings[0].ends_with("; rules files are in rules/ (point the rules path there)"),
            "{:?}",
            set.warnings
        );
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
