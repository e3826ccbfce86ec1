//! How an error is shown to a person: its message, then each cause (`source()`) its message
//! does not already say, joined by `: `, once; and the "did you mean" of a misspelt name
//! ([`closest`]), for the settings' and the rules' unknown names alike.
//!
//! The convention of the crate: an error's message may carry its cause (`cannot listen on …:
//! address in use`, the rules' every problem with file:line) or leave it to `source()` (a
//! `tonic` transport error says only `transport error` and keeps `connection refused` as its
//! source); either way [`chain`] prints each cause once. The binary prints every error that
//! stops a command through it (`main.rs`, and `app`'s fatal report).

use std::error::Error;

/// `e`'s message and each cause the text so far does not already contain.
pub fn chain(e: &(dyn Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !text.is_empty() && !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = cause.source();
    }
    out
}

/// The one of `candidates` closest to `word` by edit distance, for a "did you mean": within
/// `most` edits, ties to the one first in sort order. `None` when nothing is that close.
pub fn closest<'a>(word: &str, candidates: &[&'a str], most: usize) -> Option<&'a str> {
    candidates
        .iter()
        .map(|c| (edit_distance(word, c), *c))
        .filter(|(d, _)| *d <= most)
        .min()
        .map(|(_, c)| c)
}

/// Levenshtein distance: the names compared are short, so the simple table is fine.
pub fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closest_name_within_reach_is_suggested() {
        let names = ["requests_per_unit", "unit", "burst", "algorithm"];
        assert_eq!(
            closest("request_per_unit", &names, 3),
            Some("requests_per_unit")
        );
        assert_eq!(closest("brust", &names, 3), Some("burst"));
        assert_eq!(closest("colour", &names, 3), None);
        assert_eq!(edit_distance("", "abc"), 3);
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct E {
        text: &'static str,
        #[source]
        source: Option<Box<E>>,
    }

    fn e(text: &'static str, source: Option<E>) -> E {
        E {
            text,
            source: source.map(Box::new),
        }
    }

    #[test]
    fn each_cause_once_whether_the_message_says_it_or_not() {
        let refused = e("Connection refused (os error 111)", None);
        let transport = e("transport error", Some(refused));
        let bench = e("cannot connect to http://127.0.0.1:1", Some(transport));
        assert_eq!(
            chain(&bench),
            "cannot connect to http://127.0.0.1:1: transport error: Connection refused (os error 111)"
        );
        // A message that already carries its cause (`{0}`, `{source}`) does not repeat it.
        let inner = e("address in use", None);
        let bind = e(
            "cannot listen on 127.0.0.1:80 (gRPC): address in use",
            Some(inner),
        );
        assert_eq!(
            chain(&bind),
            "cannot listen on 127.0.0.1:80 (gRPC): address in use"
        );
        assert_eq!(chain(&e("plain", None)), "plain");
    }
}
