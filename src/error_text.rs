//! How an error is shown to a person: its message, then each cause (`source()`) its message
//! does not already say, joined by `: `, once.
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

#[cfg(test)]
mod tests {
    use super::*;

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
