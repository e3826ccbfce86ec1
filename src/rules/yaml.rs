//! A small YAML tree that remembers where every node came from, and readers for its shapes.
//!
//! The rules loader needs the line of the offending node for every error, including semantic
//! ones found long after parsing ("duplicate key", "replaces itself"). `yaml-rust2` (the
//! maintained parser the `config` crate already uses) reports a position with every parse
//! event; [`parse`] folds those events into [`Node`]s that keep their line and column, so
//! the walk (`validate/`) can point at exactly the right place.
//!
//! The readers (`fields`, `string`, `bool`, `uint`, `seq`) check a node's YAML
//! shape (a mapping with known fields, a string, a whole number …) and know nothing of rate
//! limits: on a wrong shape they record an error at the node in a `Problems` and return
//! `None`, so the walk goes on and reports every problem of the file.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

use super::error::{Pos, Problems};

#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A scalar as written; `quoted` is true for '…' and "…" (never a number, bool or null).
    Scalar {
        text: String,
        quoted: bool,
    },
    Seq(Vec<Node>),
    /// Key/value pairs in document order (duplicates are kept so the loader can report them).
    Map(Vec<(Node, Node)>),
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub value: Value,
    pub pos: Pos,
}

impl Node {
    /// A plain `~`, `null`, `Null`, `NULL` or an empty plain scalar.
    pub fn is_null(&self) -> bool {
        matches!(&self.value, Value::Scalar { text, quoted: false }
            if matches!(text.as_str(), "" | "~" | "null" | "Null" | "NULL"))
    }

    /// What the node is, for error messages: a scalar is shown as written (a quoted one as
    /// "the string \"5\"", so `requests_per_unit: "5"` says why it is not a number), cut to
    /// 40 characters.
    pub fn kind(&self) -> String {
        match &self.value {
            Value::Scalar { .. } if self.is_null() => "null".into(),
            Value::Scalar { text, quoted } => {
                let shown: String = text.chars().take(40).collect();
                let more = if shown.len() < text.len() { "…" } else { "" };
                if *quoted {
                    format!("the string \"{shown}{more}\"")
                } else {
                    format!("`{shown}{more}`")
                }
            }
            Value::Seq(_) => "a list".into(),
            Value::Map(_) => "a mapping".into(),
        }
    }
}

/// A YAML syntax error with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub pos: Pos,
    pub message: String,
}

/// Parses a file that holds one YAML document; a second document is an error at its line.
/// An empty document gives `Ok(None)`.
pub fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, true).map_err(|e| SyntaxError {
        pos: pos(e.marker()),
        message: with_hint(e.info()),
    })?;
    if let Some(message) = builder.error {
        return Err(SyntaxError {
            pos: builder.error_pos,
            message,
        });
    }
    Ok(builder.root)
}

/// The parser's message, and what usually causes it: most YAML syntax errors in a rules file
/// are indentation (a key one column off, a tab, a list item out of line).
fn with_hint(message: &str) -> String {
    const INDENT: &str = "check the indentation: the keys of one mapping start in the same column, a list's items each start with `- ` in one column, and YAML indents with spaces, never tabs";
    let indentation = [
        "mapping values are not allowed",
        "did not find expected key",
        "did not find expected '-'",
        "block sequence entries are not allowed",
        "found character that cannot start any token",
        "tabs",
    ];
    if indentation.iter().any(|m| message.contains(m)) {
        format!("{message} (hint: {INDENT})")
    } else {
        message.to_string()
    }
}

fn pos(m: &Marker) -> Pos {
    // yaml-rust2 counts lines from 1 and columns from 0.
    Pos {
        line: m.line(),
        col: m.col() + 1,
    }
}

/// Folds parser events into nodes with a stack of open collections.
#[derive(Default)]
struct Builder {
    stack: Vec<(Node, usize)>, // open collection and its anchor id (0 = none)
    root: Option<Node>,
    anchors: HashMap<usize, Node>,
    error: Option<String>,
    error_pos: Pos,
}

impl Builder {
    fn push_value(&mut self, node: Node, anchor: usize) {
        if anchor > 0 {
            self.anchors.insert(anchor, node.clone());
        }
        match self.stack.last_mut() {
            // A later document: empty ones (a trailing `---`) are harmless; one with content
            // would be dropped without a word by a one-document reader (the reference's is),
            // so the file is refused instead.
            None => match &self.root {
                Some(root) if !root.is_null() => {
                    if !node.is_null() {
                        self.error = Some(
                            "a second YAML document (after `---`): a rules file holds one \
                             document, one domain; put each domain in its own file"
                                .to_string(),
                        );
                        self.error_pos = node.pos;
                    }
                }
                _ => self.root = Some(node),
            },
            Some((parent, _)) => match &mut parent.value {
                Value::Seq(items) => items.push(node),
                // Maps are built as a flat list of alternating keys and values (see MappingEnd).
                Value::Map(pairs) => pairs.push((node, placeholder())),
                Value::Scalar { .. } => {}
            },
        }
    }
}

fn placeholder() -> Node {
    Node {
        value: Value::Scalar {
            text: String::new(),
            quoted: false,
        },
        pos: Pos::default(),
    }
}

impl MarkedEventReceiver for Builder {
    fn on_event(&mut self, ev: Event, mark: Marker) {
        if self.error.is_some() {
            return;
        }
        let at = pos(&mark);
        match ev {
            Event::Scalar(text, style, anchor, _tag) => {
                let quoted = matches!(
                    style,
                    TScalarStyle::SingleQuoted | TScalarStyle::DoubleQuoted
                );
                self.push_value(
                    Node {
                        value: Value::Scalar { text, quoted },
                        pos: at,
                    },
                    anchor,
                );
            }
            Event::SequenceStart(anchor, _) => self.stack.push((
                Node {
                    value: Value::Seq(Vec::new()),
                    pos: at,
                },
                anchor,
            )),
            Event::MappingStart(anchor, _) => self.stack.push((
                Node {
                    value: Value::Map(Vec::new()),
                    pos: at,
                },
                anchor,
            )),
            Event::SequenceEnd | Event::MappingEnd => {
                if let Some((mut node, anchor)) = self.stack.pop() {
                    if let Value::Map(flat) = &mut node.value {
                        // Entries arrived one node at a time: pair them up as key, value.
                        let items: Vec<Node> =
                            std::mem::take(flat).into_iter().map(|(k, _)| k).collect();
                        let mut it = items.into_iter();
                        while let Some(k) = it.next() {
                            let mut v = it.next().unwrap_or_else(placeholder);
                            // An empty value (`unit:` and nothing) is marked where the next
                            // token starts, often the next line: an error about it belongs
                            // on the key's line.
                            if matches!(&v.value, Value::Scalar { text, quoted: false } if text.is_empty())
                            {
                                v.pos = k.pos;
                            }
                            flat.push((k, v));
                        }
                    }
                    self.push_value(node, anchor);
                }
            }
            Event::Alias(id) => match self.anchors.get(&id).cloned() {
                Some(mut node) => {
                    node.pos = at;
                    self.push_value(node, 0);
                }
                None => {
                    self.error = Some("alias to an unknown anchor".to_string());
                    self.error_pos = at;
                }
            },
            Event::Nothing
            | Event::StreamStart
            | Event::StreamEnd
            | Event::DocumentStart
            | Event::DocumentEnd => {}
        }
    }
}

/// A mapping's fields by name, as `fields` returns them.
pub(crate) type Fields<'n> = HashMap<&'n str, &'n Node>;

/// The path of `field` inside `path` (`descriptors[0]` + `key` → `descriptors[0].key`), as
/// errors name fields.
pub(crate) fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// A mapping's fields by name; unknown and repeated fields are errors (reported, skipped).
/// `None` only when the node is not a mapping at all.
pub(crate) fn fields<'n>(
    out: &mut Problems,
    node: &'n Node,
    path: &str,
    allowed: &[&str],
) -> Option<Fields<'n>> {
    let Value::Map(pairs) = &node.value else {
        let what = if path.is_empty() { "the file" } else { path };
        out.error(
            node.pos,
            path,
            format!("{what} must be a mapping, found {}", node.kind()),
        );
        return None;
    };
    let mut found = Fields::new();
    for (k, v) in pairs {
        let Value::Scalar { text, .. } = &k.value else {
            out.error(k.pos, path, "field names must be plain strings");
            continue;
        };
        let field = join(path, text);
        if !allowed.contains(&text.as_str()) {
            // Within half the name's length (at most 3 edits): a one-letter name is near
            // every other one-letter name, and a suggestion then is a guess.
            let reach = (text.chars().count() / 2).min(3);
            let message = match crate::error_text::closest(text, allowed, reach) {
                Some(near) => format!(
                    "unknown field (did you mean `{near}`? expected one of: {})",
                    allowed.join(", ")
                ),
                None => format!("unknown field (expected one of: {})", allowed.join(", ")),
            };
            out.error(k.pos, &field, message);
        } else if found.insert(text.as_str(), v).is_some() {
            out.error(k.pos, &field, "field given twice");
        }
    }
    Some(found)
}

/// Any non-null scalar, as written (so `1` and `true` read as strings too).
pub(crate) fn string(out: &mut Problems, node: &Node, field: &str) -> Option<String> {
    match &node.value {
        Value::Scalar { text, .. } if !node.is_null() => Some(text.clone()),
        _ => {
            out.error(
                node.pos,
                field,
                format!("expected a string, found {}", node.kind()),
            );
            None
        }
    }
}

/// An unquoted `true` or `false`, in any case.
pub(crate) fn bool(out: &mut Problems, node: &Node, field: &str) -> Option<bool> {
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
    out.error(node.pos, field, "expected true or false");
    None
}

/// An unquoted whole number from 0 to `max`.
pub(crate) fn uint(out: &mut Problems, node: &Node, field: &str, max: u64) -> Option<u64> {
    let Value::Scalar {
        text,
        quoted: false,
    } = &node.value
    else {
        out.error(
            node.pos,
            field,
            format!("expected a whole number, found {}", node.kind()),
        );
        return None;
    };
    // A negative number gets its own message: "expected a whole number, found '-5'" would
    // leave the reader wondering what is not whole about it.
    if text.starts_with('-') && text[1..].chars().all(|c| c.is_ascii_digit()) && text.len() > 1 {
        out.error(
            node.pos,
            field,
            format!("must not be negative (found {text})"),
        );
        return None;
    }
    match text.parse::<u64>() {
        Ok(n) if n <= max => Some(n),
        Ok(n) => {
            out.error(node.pos, field, format!("{n} is too large (at most {max})"));
            None
        }
        Err(_) => {
            out.error(
                node.pos,
                field,
                format!("expected a whole number, found '{text}'"),
            );
            None
        }
    }
}

/// A list; null (`key:` with nothing after it) is an empty list.
pub(crate) fn seq<'n>(out: &mut Problems, node: &'n Node, field: &str) -> Option<&'n [Node]> {
    match &node.value {
        Value::Seq(items) => Some(items),
        _ if node.is_null() => Some(&[]),
        _ => {
            out.error(
                node.pos,
                field,
                format!("expected a list, found {}", node.kind()),
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scalar(n: &Node) -> &str {
        match &n.value {
            Value::Scalar { text, .. } => text,
            _ => panic!("not a scalar: {n:?}"),
        }
    }

    #[test]
    fn keeps_lines_and_columns() {
        let doc = parse("domain: x\ndescriptors:\n  - key: a\n    value: \"b\"\n")
            .unwrap()
            .unwrap();
        let Value::Map(pairs) = &doc.value else {
            panic!()
        };
        assert_eq!(scalar(&pairs[0].0), "domain");
        assert_eq!(pairs[0].0.pos, Pos { line: 1, col: 1 });
        let Value::Seq(items) = &pairs[1].1.value else {
            panic!()
        };
        assert_eq!(items[0].pos.line, 3);
        let Value::Map(d) = &items[0].value else {
            panic!()
        };
        assert_eq!((d[1].1.pos.line, d[1].1.pos.col), (4, 12));
        assert_eq!(
            d[1].1.value,
            Value::Scalar {
                text: "b".into(),
                quoted: true
            }
        );
    }

    #[test]
    fn syntax_errors_have_positions() {
        let err = parse("a: [1, 2\nb: c\n").unwrap_err();
        assert!(err.pos.line >= 1, "{err:?}");
        assert!(parse("a: b\n  c: d\n").is_err());
    }

    #[test]
    fn an_indentation_error_says_to_check_the_indentation() {
        // A key one column off, a list item out of line, a tab.
        for text in [
            "domain: x\ndescriptors:\n  - key: a\n   value: b\n",
            "domain: x\ndescriptors:\n  - key: a\n - key: b\n",
            "domain: x\ndescriptors:\n\t- key: a\n",
        ] {
            let err = parse(text).unwrap_err();
            assert!(
                err.message.contains("hint: check the indentation"),
                "{text:?}: {}",
                err.message
            );
        }
        // Not every syntax error is indentation.
        let err = parse("a: [1, 2\nb: c\n").unwrap_err();
        assert!(!err.message.contains("hint"), "{}", err.message);
    }

    #[test]
    fn empty_document_and_aliases() {
        assert_eq!(parse("").unwrap(), None);
        assert_eq!(parse("# only a comment\n").unwrap(), None);
        let doc = parse("a: &x {k: v}\nb: *x\n").unwrap().unwrap();
        let Value::Map(pairs) = &doc.value else {
            panic!()
        };
        assert!(matches!(pairs[1].1.value, Value::Map(_)));
        assert_eq!(pairs[1].1.pos.line, 2);
    }

    #[test]
    fn keeps_duplicate_keys_for_the_loader() {
        let doc = parse("a: 1\na: 2\n").unwrap().unwrap();
        let Value::Map(pairs) = &doc.value else {
            panic!()
        };
        assert_eq!(pairs.len(), 2);
    }

    #[test]
    fn readers_check_shapes_and_record_errors_at_the_node() {
        let doc = parse("a: 1\nb: -5\nc: \"7\"\nd: TRUE\ne: ~\nf: [x]\ng: 1\ng: 2\nz: 0\n")
            .unwrap()
            .unwrap();
        let mut out = Problems::new(std::path::Path::new("r.yaml"));
        let f = fields(&mut out, &doc, "top", &["a", "b", "c", "d", "e", "f", "g"]).unwrap();
        let messages = |out: &Problems| -> Vec<(usize, String, String)> {
            let e = out.errors.iter();
            e.map(|e| (e.line, e.field.clone(), e.message.clone()))
                .collect()
        };
        assert_eq!(
            messages(&out),
            [
                (8, "top.g".into(), "field given twice".into()),
                (
                    9,
                    "top.z".into(),
                    "unknown field (expected one of: a, b, c, d, e, f, g)".into()
                ),
            ]
        );
        out.errors.clear();
        assert_eq!(uint(&mut out, f["a"], "a", 1), Some(1));
        // A misspelt name gets the nearest one.
        let doc = parse("rate_limit: 1\nrequest_per_unit: 2\n")
            .unwrap()
            .unwrap();
        fields(
            &mut out,
            &doc,
            "top",
            &["rate_limit", "requests_per_unit", "unit"],
        );
        assert_eq!(
            out.errors[0].message,
            "unknown field (did you mean `requests_per_unit`? expected one of: rate_limit, requests_per_unit, unit)"
        );
        out.errors.clear();
        assert_eq!(uint(&mut out, f["a"], "a", 0), None);
        assert_eq!(uint(&mut out, f["b"], "b", 9), None);
        assert_eq!(uint(&mut out, f["c"], "c", 9), None); // quoted: a string, not a number
        assert_eq!(bool(&mut out, f["d"], "d"), Some(true));
        assert_eq!(bool(&mut out, f["a"], "a"), None);
        assert_eq!(string(&mut out, f["c"], "c").as_deref(), Some("7"));
        assert_eq!(string(&mut out, f["e"], "e"), None);
        assert_eq!(seq(&mut out, f["e"], "e").map(<[Node]>::len), Some(0));
        assert_eq!(seq(&mut out, f["f"], "f").map(<[Node]>::len), Some(1));
        assert_eq!(seq(&mut out, f["a"], "a"), None);
        let got: Vec<_> = messages(&out).into_iter().map(|(l, _, m)| (l, m)).collect();
        assert_eq!(
            got,
            [
                (1, "1 is too large (at most 0)".to_string()),
                (2, "must not be negative (found -5)".into()),
                (3, "expected a whole number, found the string \"7\"".into()),
                (1, "expected true or false".into()),
                (5, "expected a string, found null".into()),
                (1, "expected a list, found `1`".into()),
            ]
        );
        assert!(fields(&mut out, f["f"], "f", &[]).is_none());
        assert_eq!(
            out.errors.last().map(|e| e.message.as_str()),
            Some("f must be a mapping, found a list")
        );
        assert_eq!(join("", "domain"), "domain");
        assert_eq!(join("descriptors[0]", "key"), "descriptors[0].key");
    }
}
