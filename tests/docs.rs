//! The documentation stays true: every relative link and anchor in the README, ARCHITECTURE.md,
//! CHANGELOG.md, docs/ and the chart's pages resolves; the README stays a door (at most ~200
//! lines); and every page of docs/ a comment or message in `src/` points at exists, with its
//! anchor; every code block of the README and docs/ is loaded or run: a rules file loads, a
//! simulate scenario loads, any other YAML parses, and each command of a `sh` block names a
//! `make` target that exists, a `tollgate` subcommand whose flags exist (`tollgate check` and
//! `tollgate simulate` run on their files), files that exist, and JSON that parses. (The
//! settings table is held to the code by `settings::tests`, the "what differs" table by
//! `settings::reference::differences::tests`.)

use std::collections::HashSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Markdown pages whose links are checked.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CHANGELOG.md",
        "charts/tollgate/README.md",
        "charts/tollgate/CHANGELOG.md",
    ]
    .iter()
    .map(|p| root.join(p))
    .collect();
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    pages.extend(docs);
    pages
}

/// A heading's anchor as GitHub makes it: lowercase, punctuation but `-` and `_` dropped,
/// spaces as `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, ' ' | '-' | '_'))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The text of `page` outside fenced code blocks.
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .filter(|l| {
            if l.trim_start().starts_with("```") {
                fenced = !fenced;
                return false;
            }
            !fenced
        })
        .collect()
}

/// Every anchor of a page: its headings' slugs, a repeated one also with `-1`, `-2`, ….
fn anchors(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    for line in prose(text) {
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            let s = slug(&line[hashes + 1..]);
            let mut candidate = s.clone();
            let mut n = 0;
            while !out.insert(candidate.clone()) {
                n += 1;
                candidate = format!("{s}-{n}");
            }
        }
    }
    out
}

/// The targets of `[text](target)` links in prose.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in prose(text) {
        let mut rest = line;
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            out.push(after[..end].to_string());
            rest = &after[end.min(after.len())..];
        }
    }
    out
}

/// Whether `target` (a path relative to `from`'s directory, with an optional `#anchor`)
/// resolves; `Err` says why not.
fn resolve(from: &Path, target: &str) -> Result<(), String> {
    let (path, anchor) = match target.split_once('#') {
        Some((p, a)) => (p, Some(a)),
        None => (target, None),
    };
    let file = if path.is_empty() {
        from.to_path_buf()
    } else {
        from.parent().unwrap().join(path)
    };
    if !file.exists() {
        return Err(format!("{} does not exist", file.display()));
    }
    if let Some(anchor) = anchor {
        let text = std::fs::read_to_string(&file).map_err(|e| e.to_string())?;
        if !anchors(&text).contains(anchor) {
            return Err(format!("no heading #{anchor} in {}", file.display()));
        }
    }
    Ok(())
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = std::fs::read_to_string(&page).unwrap();
        for target in links(&text) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            checked += 1;
            if let Err(e) = resolve(&page, &target) {
                broken.push(format!("{}: ({target}): {e}", page.display()));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser blind?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_is_a_door() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 200,
        "README.md has {lines} lines: topics go in docs/"
    );
    // It maps every page of docs/.
    for page in pages()
        .iter()
        .filter(|p| p.starts_with(root().join("docs")))
    {
        let name = page.file_name().unwrap().to_str().unwrap();
        assert!(
            readme.contains(&format!("(docs/{name}")),
            "README.md does not map docs/{name}"
        );
    }
}

/// A comment or message in `src/` that names a page of the docs names one that exists (with
/// its anchor), and none cites a README heading: the README holds none.
#[test]
fn src_points_only_at_docs_that_exist() {
    let mut problems = Vec::new();
    let mut stack = vec![root().join("src")];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            for (n, line) in text.lines().enumerate() {
                let at = format!("{}:{}", path.display(), n + 1);
                if line.contains("README, ") || line.contains("README's ") {
                    problems.push(format!("{at}: cites a README section: {}", line.trim()));
                }
                let mut rest = line;
                while let Some(i) = rest.find("docs/") {
                    let after = &rest[i..];
                    let end = after
                        .find(|c: char| !(c.is_alphanumeric() || "/._-#".contains(c)))
                        .unwrap_or(after.len());
                    let target = after[..end].trim_end_matches(['.', ')']);
                    if target.contains(".md")
                        && let Err(e) = resolve(&root().join("README.md"), target)
                    {
                        problems.push(format!("{at}: {target}: {e}"));
                    }
                    rest = &after[end.max(1)..];
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// The fenced code blocks of a page: (info string, line of the fence, text).
fn code_blocks(text: &str) -> Vec<(String, usize, String)> {
    let mut blocks = Vec::new();
    let mut open: Option<(String, usize, String)> = None;
    for (i, line) in text.lines().enumerate() {
        let fence = line.trim_start().starts_with("```");
        match (&mut open, fence) {
            (None, true) => {
                open = Some((
                    line.trim_start()[3..].trim().to_string(),
                    i + 1,
                    String::new(),
                ))
            }
            (Some(_), true) => blocks.extend(open.take()),
            (Some((_, _, body)), false) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, false) => {}
        }
    }
    blocks
}

/// The commands of a `sh` block: comments dropped, `\` continuations joined.
fn commands(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in body.lines() {
        let line = match line.find(" #") {
            Some(at) if !line[..at].contains('\'') || line[..at].matches('\'').count() % 2 == 0 => {
                &line[..at]
            }
            _ => line,
        };
        if line.trim_start().starts_with('#') {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(part) => current.push_str(part),
            None => {
                current.push_str(line);
                if !current.trim().is_empty() {
                    out.push(current.trim().to_string());
                }
                current.clear();
            }
        }
    }
    out
}

/// Splits a command line into words as a shell would for these simple lines: spaces, and
/// single- or double-quoted words kept whole (quotes dropped).
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut any = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(c);
                any = true;
            }
            (None, ' ') => {
                if any || !word.is_empty() {
                    out.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        out.push(word);
    }
    out
}

fn tollgate(args: &[&str]) -> (bool, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tollgate"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run tollgate");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// What one command of a `sh` block must hold to; `None` when it is not one this test can
/// check (a loop, a `curl` of a live server without a body).
fn check_command(line: &str, makefile: &str) -> Option<Result<(), String>> {
    let w = words(line);
    let first = w.first()?.as_str();
    let root = root();
    let exists = |p: &str| {
        if root.join(p).exists() {
            Ok(())
        } else {
            Err(format!("{p} does not exist"))
        }
    };
    Some(match first {
        "make" => {
            let target = w.get(1)?;
            if makefile
                .lines()
                .any(|l| l.starts_with(&format!("{target}:")))
            {
                Ok(())
            } else {
                Err(format!("no `{target}` target in the Makefile"))
            }
        }
        "tollgate" | "./target/release/tollgate" => {
            let sub = w.get(1)?.as_str();
            let (ok, help) = tollgate(&[sub, "--help"]);
            if !ok {
                return Some(Err(format!("`tollgate {sub} --help` failed: {help}")));
            }
            for flag in w.iter().filter(|a| a.starts_with("--")) {
                let name = flag.split('=').next().unwrap_or(flag);
                // The flag as a whole word of the help (`--key` is not `--keys`).
                let named = help.match_indices(name).any(|(at, _)| {
                    !help[at + name.len()..]
                        .starts_with(|c: char| c.is_alphanumeric() || c == '-' || c == '_')
                });
                if !named {
                    return Some(Err(format!("`tollgate {sub}` has no {name}")));
                }
            }
            for path in w.iter().filter(|a| a.starts_with("examples/")) {
                if let Err(e) = exists(path) {
                    return Some(Err(e));
                }
            }
            match sub {
                "check" => {
                    let (ok, out) = tollgate(&["check", &w[2]]);
                    if ok { Ok(()) } else { Err(out) }
                }
                "simulate" => tollgate::sim::Scenario::load(&root.join(&w[2]))
                    .map(|_| ())
                    .map_err(|e| e.to_string()),
                _ => Ok(()),
            }
        }
        "helm" => {
            let paths = w.iter().filter_map(|w| {
                if w.starts_with("charts/") {
                    return Some(w.as_str());
                }
                w.split_once('=')
                    .map(|(_, p)| p)
                    .filter(|p| p.starts_with("examples/"))
            });
            paths
                .map(exists)
                .collect::<Result<Vec<()>, String>>()
                .map(|_| ())
        }
        "curl" => {
            let body = w
                .iter()
                .position(|a| a == "-d")
                .and_then(|i| w.get(i + 1))?;
            serde_json::from_str::<serde_json::Value>(body)
                .map(|_| ())
                .map_err(|e| format!("the body is not JSON: {e}"))
        }
        _ => return None,
    })
}

/// A YAML block: a rules file loads, a simulate scenario loads (its relative paths from
/// examples/simulate/), anything else (an Envoy or Gateway fragment) parses as YAML.
fn check_yaml(body: &str, scratch: &Path) -> Result<&'static str, String> {
    let yaml = yaml_rust2::YamlLoader::load_from_str(body).map_err(|e| e.to_string())?;
    let top = yaml.first().ok_or("empty")?;
    if !top["duration_s"].is_badvalue() {
        let path = root().join("examples/simulate/from-the-docs.yaml");
        return tollgate::sim::Scenario::parse(&path, body)
            .map(|_| "scenario")
            .map_err(|e| e.to_string());
    }
    if !top["domain"].is_badvalue() && !top["descriptors"].is_badvalue() {
        std::fs::write(scratch.join("rules.yaml"), body).map_err(|e| e.to_string())?;
        return tollgate::rules::load_path(scratch, tollgate::rules::LoadOptions::default())
            .map(|_| "rules")
            .map_err(|e| e.to_string());
    }
    Ok("yaml")
}

#[test]
fn every_code_block_is_loaded_or_run() {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let mut pages = vec![root().join("README.md")];
    pages.extend(pages_under_docs());
    let (mut checked, mut kinds) = (0, HashSet::new());
    let mut failures = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let name = page.strip_prefix(root()).unwrap().display().to_string();
        for (info, line, body) in code_blocks(&text) {
            match info.as_str() {
                "yaml" => {
                    let scratch = tempfile::tempdir().unwrap();
                    match check_yaml(&body, scratch.path()) {
                        Ok(kind) => {
                            checked += 1;
                            kinds.insert(kind);
                        }
                        Err(e) => failures.push(format!("{name}:{line}: {e}")),
                    }
                }
                "sh" => {
                    for command in commands(&body) {
                        match check_command(&command, &makefile) {
                            Some(Ok(())) => checked += 1,
                            Some(Err(e)) => {
                                failures.push(format!("{name}:{line}: `{command}`: {e}"))
                            }
                            None => {}
                        }
                    }
                }
                _ => {}
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Not vacuous: the pages hold rules, a scenario, other YAML and commands.
    assert!(
        checked >= 20 && kinds.len() == 3,
        "{checked} blocks or commands checked, kinds {kinds:?}"
    );
}

fn pages_under_docs() -> Vec<PathBuf> {
    pages()
        .into_iter()
        .filter(|p| p.parent().is_some_and(|d| d.ends_with("docs")))
        .collect()
}

/// Every saved property-test regression is replayed: proptest finds a file under
/// `proptest-regressions/` by its test's source path (`src/x/y.rs` → `x/y.txt`, and
/// `tests/common::proptest_config` uses `tests/<name>.txt` for `tests/<name>.rs`), so a file
/// whose source was moved or deleted is silently never read again.
#[test]
fn every_proptest_regression_file_belongs_to_a_source_file() {
    let dir = root().join("proptest-regressions");
    let mut stack = vec![dir.clone()];
    let mut orphans = Vec::new();
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(&dir).unwrap().with_extension("rs");
            let source = if rel.starts_with("tests") {
                root().join(&rel)
            } else {
                root().join("src").join(&rel)
            };
            if !source.is_file() {
                orphans.push(format!("{} (no {})", path.display(), source.display()));
            }
        }
    }
    assert!(
        orphans.is_empty(),
        "regressions no test replays: {orphans:#?}"
    );
}
