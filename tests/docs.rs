//! The documentation stays true: every relative link and anchor in the README, ARCHITECTURE.md,
//! CHANGELOG.md, docs/ and the chart's pages resolves; the README stays a door (at most ~200
//! lines); and every page of docs/ a comment or message in `src/` points at exists, with its
//! anchor. (The settings table is held to the code by `settings::tests`, the "what differs"
//! table by `settings::reference::differences::tests`.)

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
