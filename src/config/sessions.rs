//! `[queue] session_sources` (SPEC section 10, issue \[10\]): where a request's session identity
//! comes from, as an ordered list of `"header:NAME"` and `"body:FIELD"` entries. The first one
//! present in a request gives its session.
//!
//! Unset, the list is the default: `header:` + `session_header` (so that key keeps working as
//! it always has, and setting it moves the default list's first entry), then OpenAI's
//! `prompt_cache_key` body field, then the session headers that agent harnesses send
//! ([`HARNESS_HEADERS`]; where each comes from is in `docs/configuration.md`). OpenAI's `user`
//! field is not in it: it names an end user, whose many conversations would become one session.

use std::fmt;

/// Most entries in a `session_sources` list: each header entry is a look-up in the request's
/// headers, each body entry a key compared at the top level of every body.
pub const SESSION_SOURCES_MAX: usize = 16;

/// Longest body field name, in bytes.
pub const BODY_FIELD_BYTES_MAX: usize = 64;

/// The body field of the default list after the configured header: OpenAI's `prompt_cache_key`
/// (the Chat Completions and Responses APIs), which clients set per conversation.
pub const PROMPT_CACHE_KEY: &str = "prompt_cache_key";

/// The headers of the default list after `prompt_cache_key`, in order: what coding agents and
/// SDKs send per conversation (sources in `docs/configuration.md`, "Where sessions come from").
pub const HARNESS_HEADERS: [&str; 4] =
    ["x-session-affinity", "session_id", "x-opencode-session", "x-claude-code-session-id"];

/// One entry of `session_sources`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum SessionSource {
    /// A request header, matched case-insensitively (stored as configured).
    Header(String),
    /// A top-level string field of the JSON body, matched exactly (after unescaping the key).
    Body(String),
}

impl SessionSource {
    /// Parses `"header:NAME"` or `"body:FIELD"`; the reason when it is neither or the name is
    /// not valid for its kind.
    pub fn parse(entry: &str) -> Result<SessionSource, String> {
        if let Some(name) = entry.strip_prefix("header:") {
            if name.is_empty() {
                return Err("empty header name after \"header:\"".to_owned());
            }
            if !is_header_name(name) {
                return Err(format!(
                    "{name:?} is not a valid HTTP header name \
                     (letters, digits and !#$%&'*+-.^_`|~, at most 256 bytes)"
                ));
            }
            return Ok(SessionSource::Header(name.to_owned()));
        }
        if let Some(field) = entry.strip_prefix("body:") {
            if field.is_empty() {
                return Err("empty field name after \"body:\"".to_owned());
            }
            if field.len() > BODY_FIELD_BYTES_MAX || field.chars().any(char::is_control) {
                return Err(format!(
                    "{field:?} is not a usable body field name (at most {BODY_FIELD_BYTES_MAX} \
                     bytes, no control characters)"
                ));
            }
            if field == "model" || field == "stream" {
                return Err(format!("{field:?} is read by the router for itself, not a session"));
            }
            return Ok(SessionSource::Body(field.to_owned()));
        }
        Err("expected \"header:NAME\" or \"body:FIELD\"".to_owned())
    }

    /// Whether `other` names the same source: header names compare case-insensitively.
    fn same(&self, other: &SessionSource) -> bool {
        match (self, other) {
            (SessionSource::Header(a), SessionSource::Header(b)) => a.eq_ignore_ascii_case(b),
            (SessionSource::Body(a), SessionSource::Body(b)) => a == b,
            _ => false,
        }
    }
}

impl fmt::Display for SessionSource {
    /// The configuration spelling: `header:NAME` or `body:FIELD`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SessionSource::Header(name) => write!(f, "header:{name}"),
            SessionSource::Body(field) => write!(f, "body:{field}"),
        }
    }
}

/// The default list for a queue whose `session_header` is `session_header`: that header,
/// `body:prompt_cache_key`, then [`HARNESS_HEADERS`] (one that repeats the configured header is
/// left out).
pub fn default_sources(session_header: &str) -> Vec<SessionSource> {
    let mut sources = vec![
        SessionSource::Header(session_header.to_owned()),
        SessionSource::Body(PROMPT_CACHE_KEY.to_owned()),
    ];
    for header in HARNESS_HEADERS {
        if !header.eq_ignore_ascii_case(session_header) {
            sources.push(SessionSource::Header(header.to_owned()));
        }
    }
    sources
}

/// Parses and checks an explicit list: every entry valid, no entry twice (header names compare
/// case-insensitively), at most [`SESSION_SOURCES_MAX`] entries. The error gives the offending
/// entry's index (`None`: the whole list) and the reason.
pub(crate) fn parse_list(entries: &[String]) -> Result<Vec<SessionSource>, ListError> {
    if entries.len() > SESSION_SOURCES_MAX {
        let reason = format!("at most {SESSION_SOURCES_MAX} entries, found {}", entries.len());
        return Err((None, reason));
    }
    let mut sources: Vec<SessionSource> = Vec::with_capacity(entries.len());
    for (index, entry) in entries.iter().enumerate() {
        let source = SessionSource::parse(entry).map_err(|reason| (Some(index), reason))?;
        if let Some(first) = sources.iter().position(|seen| seen.same(&source)) {
            let reason = format!("the same source as session_sources[{first}]");
            return Err((Some(index), reason));
        }
        sources.push(source);
    }
    Ok(sources)
}

/// Which entry of a list is wrong (`None`: the list as a whole), and why.
pub(crate) type ListError = (Option<usize>, String);

/// An HTTP field name: one or more `tchar` (RFC 9110, 5.6.2), at most 256 bytes.
pub(crate) fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(entries: &[&str]) -> Result<Vec<SessionSource>, ListError> {
        parse_list(&entries.iter().map(|e| (*e).to_owned()).collect::<Vec<_>>())
    }

    #[test]
    fn entries_parse_by_prefix() {
        assert_eq!(
            list(&["header:X-Conv", "body:conversation_id"]),
            Ok(vec![
                SessionSource::Header("X-Conv".to_owned()),
                SessionSource::Body("conversation_id".to_owned()),
            ])
        );
        let refused = |entries: &[&str]| list(entries).unwrap_err();
        assert_eq!(refused(&["X-Conv"]).1, "expected \"header:NAME\" or \"body:FIELD\"");
        assert_eq!(refused(&["header:"]).1, "empty header name after \"header:\"");
        assert_eq!(refused(&["body:"]).1, "empty field name after \"body:\"");
        assert!(refused(&["header:a b"]).1.contains("not a valid HTTP header name"));
        assert!(refused(&["body:model"]).1.contains("not a session"));
        assert!(refused(&["body:stream"]).1.contains("not a session"));
        assert!(refused(&["body:a\nb"]).1.contains("not a usable body field name"));
        assert_eq!(
            refused(&["header:a", "body:a", "header:A"]),
            (Some(2), "the same source as session_sources[0]".to_owned())
        );
        let many: Vec<String> = (0..=SESSION_SOURCES_MAX).map(|i| format!("body:f{i}")).collect();
        assert!(parse_list(&many).unwrap_err().1.starts_with("at most 16 entries"));
        assert_eq!(list(&[]), Ok(Vec::new()));
    }

    #[test]
    fn the_default_list_follows_session_header() {
        let sources = default_sources("X-Session-ID");
        let shown: Vec<String> = sources.iter().map(ToString::to_string).collect();
        assert_eq!(
            shown,
            [
                "header:X-Session-ID",
                "body:prompt_cache_key",
                "header:x-session-affinity",
                "header:session_id",
                "header:x-opencode-session",
                "header:x-claude-code-session-id",
            ]
        );
        let moved = default_sources("X-Session-Affinity");
        assert_eq!(moved[0], SessionSource::Header("X-Session-Affinity".to_owned()));
        assert_eq!(moved.len(), 5, "the configured header is not listed twice");
        let entries: Vec<String> = sources.iter().map(ToString::to_string).collect();
        assert_eq!(parse_list(&entries), Ok(sources), "the default list is a valid list");
    }
}
