//! What may be shown of a value that can hold a secret: a store URL's password never reaches
//! a log line, `/config` or an error message.

/// `scheme://user:secret@host` → `scheme://user:***@host` (each host of a cluster URL too).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    let Some((auth, hosts)) = rest.rsplit_once('@') else {
        return url.to_string();
    };
    let user = auth.split_once(':').map_or("", |(u, _)| u);
    format!("{scheme}://{user}:***@{hosts}")
}
