//! Credentials never shown: URLs a user configures (`env.external.url`, `pats.reviewer_url`,
//! `metrics.pushgateway_url`, `tracking.mlflow_url`) may carry `user:password@`, which the
//! clients use but no message, log line, printed config or tracker may repeat.
//!
//! Invariant RD-1: [`redact_url`] replaces the whole user-info part of a URL by `***` and
//! leaves everything else as it was; a string that is not a URL with user info comes back
//! unchanged.

/// `url` with its user info (`user:password@`) replaced by `***@` (RD-1).
pub fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // The authority ends at the first '/', '?' or '#'; user info is what precedes its last '@'.
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    match authority.rfind('@') {
        Some(at) => format!("{scheme}://***@{}{tail}", &authority[at + 1..]),
        None => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::redact_url;

    #[test]
    fn rd1_user_info_is_replaced_and_nothing_else() {
        assert_eq!(
            redact_url("http://alice:s3cret@127.0.0.1:5000/api?x=1"),
            "http://***@127.0.0.1:5000/api?x=1"
        );
        assert_eq!(redact_url("https://tok@host/p@th"), "https://***@host/p@th");
        assert_eq!(redact_url("http://a:b@c@host"), "http://***@host");
        for plain in ["http://127.0.0.1:9091", "", "not a url", "http://host/a@b"] {
            assert_eq!(redact_url(plain), plain);
        }
    }
}
