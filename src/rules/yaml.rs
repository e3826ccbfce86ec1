//! A small YAML tree that remembers where every node came from.
//!
//! The rules loader needs the line of the offending node for every error, including semantic
//! ones found long after parsing ("duplicate key", "replaces itself"). `yaml-rust2` (the
//! maintained parser the `config` crate already uses) reports a position with every parse
//! event; this module folds those events into [`Node`]s that keep their line and column, so
//! the loader can walk the tree and point at exactly the right place.

use std::collections::HashMap;

use yaml_rust2::parser::{Event, MarkedEventReceiver, Parser};
use yaml_rust2::scanner::{Marker, TScalarStyle};

/// Where a node starts in its file (1-based line and column).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Pos {
    pub line: usize,
    pub col: usize,
}

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

    /// A short name for the node's kind, for error messages.
    pub fn kind(&self) -> &'static str {
        match &self.value {
            Value::Scalar { .. } if self.is_null() => "null",
            Value::Scalar { .. } => "a scalar",
            Value::Seq(_) => "a list",
            Value::Map(_) => "a mapping",
        }
    }
}

/// A YAML syntax error with its position.
#[derive(Debug, Clone, PartialEq)]
pub struct SyntaxError {
    pub pos: Pos,
    pub message: String,
}

/// Parses one YAML document. An empty document gives `Ok(None)`.
pub fn parse(text: &str) -> Result<Option<Node>, SyntaxError> {
    let mut builder = Builder::default();
    let mut parser = Parser::new_from_str(text);
    parser.load(&mut builder, false).map_err(|e| SyntaxError {
        pos: pos(e.marker()),
        message: e.info().to_string(),
    })?;
    if let Some(message) = builder.error {
        return Err(SyntaxError {
            pos: builder.error_pos,
            message,
        });
    }
    Ok(builder.root)
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
            None => self.root = Some(node),
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
                            let v = it.next().unwrap_or_else(placeholder);
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
}
