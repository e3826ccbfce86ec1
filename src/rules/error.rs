//! What can be wrong with the rules, and where the walk of one file writes it down.
//!
//! The walk (`validate/`, through the readers in `yaml.rs`) records every problem of a file
//! in a `Problems` instead of stopping at the first, so one run of `tollgate check` lists
//! them all. `load.rs` gathers the files' problems into one [`RulesError`] (the load fails)
//! and their warnings into `RuleSet::warnings` (the load succeeds).

use std::fmt;
use std::path::{Path, PathBuf};

/// Where a node starts in its file (1-based line and column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
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

impl RuleError {
    /// A problem with the file or directory as a whole (it cannot be read), so no position.
    pub fn whole_file(file: &Path, message: String) -> RuleError {
        RuleError {
            file: file.to_path_buf(),
            line: 0,
            col: 0,
            field: String::new(),
            message,
        }
    }
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

/// What the walk of one rules file found so far: errors (the file is refused) and warnings
/// (the file is accepted, but something in it does not do what it may seem to).
///
/// One per file, so the readers only pass a position and a field path and every entry still
/// names its file.
#[derive(Debug)]
pub(crate) struct Problems {
    file: PathBuf,
    pub(crate) errors: Vec<RuleError>,
    /// As `file:line: field: message`.
    pub(crate) warnings: Vec<String>,
}

impl Problems {
    pub(crate) fn new(file: &Path) -> Problems {
        Problems {
            file: file.to_path_buf(),
            errors: Vec::new(),
            warnings: Vec::new(),
        }
    }

    pub(crate) fn file(&self) -> &Path {
        &self.file
    }

    pub(crate) fn error(&mut self, pos: Pos, field: &str, message: impl Into<String>) {
        self.errors.push(RuleError {
            file: self.file.clone(),
            line: pos.line,
            col: pos.col,
            field: field.to_string(),
            message: message.into(),
        });
    }

    pub(crate) fn warn(&mut self, pos: Pos, field: &str, message: &str) {
        self.warnings.push(format!(
            "{}:{}: {field}: {message}",
            self.file.display(),
            pos.line
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // `tollgate check` prints these, and users grep them: the shapes are part of the interface.
    #[test]
    fn errors_print_as_file_line_col_field_message() {
        let mut p = Problems::new(Path::new("r.yaml"));
        p.error(
            Pos { line: 4, col: 7 },
            "descriptors[0].key",
            "must not be empty",
        );
        p.error(Pos { line: 1, col: 1 }, "", "the file is empty");
        p.warn(
            Pos { line: 9, col: 3 },
            "descriptors[1].metadata",
            "ignored",
        );
        let whole = RuleError::whole_file(Path::new("rules"), "cannot read: gone".into());
        assert_eq!(p.warnings, ["r.yaml:9: descriptors[1].metadata: ignored"]);
        let one = RulesError {
            errors: vec![whole.clone()],
        };
        assert_eq!(
            one.to_string(),
            "1 error in the rules\n  rules: cannot read: gone"
        );
        let mut errors = p.errors;
        errors.push(whole);
        assert_eq!(
            RulesError { errors }.to_string(),
            "3 errors in the rules\n  r.yaml:4:7: descriptors[0].key: must not be empty\n  r.yaml:1:1: the file is empty\n  rules: cannot read: gone"
        );
    }
}
