//! API keys and the admin token (issue \[11\]): their SHA-256 digests, the table that finds a
//! tenant by digest, the `Authorization` header's `Bearer` and `Basic` forms, and new random
//! tokens for `warmpath keygen`; and the other direction, the key warmpath presents to a model's
//! engines ([`read_backend_key`], `backend_api_key_file`).
//!
//! The configuration holds digests only, never a token: a reader of the file (or of
//! `warmpath check-config`'s output) learns nothing that authenticates. A request's token is
//! hashed with SHA-256 ([`digest`]) and the digest looked up in a [`KeyTable`]: a binary
//! search on the digest's first 8 bytes finds the candidate, and the whole 32 bytes are then
//! compared in constant time (`subtle`). Every lookup makes at least one such comparison, against
//! a fixed stand-in when no stored digest shares the prefix, so a hit and a miss run the same
//! code. The search itself depends on the digest's value; that tells an attacker nothing about
//! a stored digest they could use, because steering a token's digest towards a chosen prefix
//! is a preimage attack on SHA-256 (the usual argument for comparing hashes rather than
//! secrets; `docs/security.md` has the threat model).
//!
//! Tokens from [`new_token`] are [`TOKEN_PREFIX`] and 32 bytes of the operating system's
//! CSPRNG (`getrandom`) in base64url without padding (RFC 4648 section 5): 256 bits, so a
//! digest stored in a configuration cannot be reversed by search either.
//!
//! Nothing here allocates on the request path: [`authorize`] and [`KeyTable::find`] work on
//! the header's bytes and a digest on the stack. (Decoding `Basic` credentials, for the admin
//! listener only, does.)

use sha2::{Digest as _, Sha256};
use subtle::ConstantTimeEq;

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// What [`new_token`] puts in front of the random part, so a leaked token is recognisable
/// (by a secret scanner, say) as warmpath's.
pub const TOKEN_PREFIX: &str = "wp_";

/// Random bytes in a new token.
pub const TOKEN_RANDOM_BYTES: usize = 32;

/// Longest bearer token accepted (a longer one is malformed). The head limit bounds it anyway;
/// this keeps the hash of a refused token cheap.
pub const TOKEN_BYTES_MAX: usize = 1024;

/// The SHA-256 of `token`.
pub fn digest(token: &[u8]) -> Digest {
    Sha256::digest(token).into()
}

/// Whether two digests are equal, in time that does not depend on where they differ: the
/// XOR of each 8-byte word, ORed together (no branch, no early exit), and `subtle`'s
/// comparison of that word with 0. (`subtle`'s comparison of the 32-byte slices themselves
/// goes byte by byte through an optimisation barrier: 4x slower, `benches/auth.rs`.)
pub fn digests_equal(a: &Digest, b: &Digest) -> bool {
    let word = |d: &Digest, i: usize| {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&d[8 * i..8 * i + 8]);
        u64::from_ne_bytes(bytes)
    };
    let difference = (0..4).fold(0u64, |acc, i| acc | (word(a, i) ^ word(b, i)));
    difference.ct_eq(&0).into()
}

/// 64 hex digits, either case, as a digest; the reason otherwise.
pub fn parse_hex_digest(text: &str) -> Result<Digest, String> {
    let bytes = text.as_bytes();
    if bytes.len() != 64 {
        return Err(format!("expected 64 hex digits, found {} characters", text.chars().count()));
    }
    let mut out = [0u8; 32];
    for (i, pair) in bytes.chunks_exact(2).enumerate() {
        let (Some(high), Some(low)) = (hex_value(pair[0]), hex_value(pair[1])) else {
            return Err("expected 64 hex digits (0-9, a-f), found another character".to_owned());
        };
        out[i] = high << 4 | low;
    }
    Ok(out)
}

fn hex_value(byte: u8) -> Option<u8> {
    match byte {
        b'0'..=b'9' => Some(byte - b'0'),
        b'a'..=b'f' => Some(byte - b'a' + 10),
        b'A'..=b'F' => Some(byte - b'A' + 10),
        _ => None,
    }
}

/// A digest as 64 lowercase hex digits (the normalised spelling).
pub fn hex(digest: &Digest) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for byte in digest {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0xf)]));
    }
    out
}

/// Why a request's credentials were refused (the main listener answers 401
/// `invalid_api_key` for each, with [`AuthError::message`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AuthError {
    /// No `Authorization` header.
    Missing,
    /// More than one `Authorization` header.
    Repeated,
    /// An `Authorization` header whose value is not `<scheme> <credentials>`, or a bearer
    /// token that is empty, too long or has characters outside RFC 6750's `b64token`.
    Malformed,
    /// A scheme other than `Bearer` (`Basic`, for one).
    NotBearer,
    /// A well-formed bearer token whose digest no live tenant lists.
    Unknown,
}

impl AuthError {
    /// The message of the 401 answer.
    pub fn message(self) -> &'static str {
        match self {
            AuthError::Missing => "no API key: send it as Authorization: Bearer <key>",
            AuthError::Repeated => "more than one Authorization header",
            AuthError::Malformed => "malformed Authorization header: expected Bearer <key>",
            AuthError::NotBearer => "API keys go in Authorization: Bearer <key>; no other scheme",
            AuthError::Unknown => "invalid API key",
        }
    }
}

/// The token of an `Authorization: Bearer <token>` value (RFC 6750 2.1: the scheme in any
/// case, one or more spaces, a `b64token`; surrounding whitespace is ignored).
pub fn bearer_token(value: &[u8]) -> Result<&[u8], AuthError> {
    let (scheme, credentials) = split_scheme(value).ok_or(AuthError::Malformed)?;
    if !scheme.eq_ignore_ascii_case(b"bearer") {
        return Err(AuthError::NotBearer);
    }
    if credentials.len() > TOKEN_BYTES_MAX || !is_b64token(credentials) {
        return Err(AuthError::Malformed);
    }
    Ok(credentials)
}

/// `<scheme> SP+ <credentials>` of a trimmed header value; `None` when either part is missing
/// or the credentials contain whitespace.
fn split_scheme(value: &[u8]) -> Option<(&[u8], &[u8])> {
    let value = value.trim_ascii();
    let space = value.iter().position(|&b| b == b' ' || b == b'\t')?;
    let (scheme, rest) = value.split_at(space);
    let credentials = rest.trim_ascii_start();
    let whole = !credentials.is_empty() && !credentials.iter().any(|&b| b == b' ' || b == b'\t');
    (!scheme.is_empty() && whole).then_some((scheme, credentials))
}

/// RFC 6750's `b64token`: `1*( ALPHA / DIGIT / "-" / "." / "_" / "~" / "+" / "/" ) *"="`.
fn is_b64token(token: &[u8]) -> bool {
    let body = token.len() - token.iter().rev().take_while(|&&b| b == b'=').count();
    body > 0
        && token[..body].iter().all(|&b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
        })
}

/// The tenant named by a request's `Authorization` header values (each line's value, in
/// order): exactly one, `Bearer`, whose token's digest `keys` holds.
pub fn authorize<'h>(
    mut values: impl Iterator<Item = &'h [u8]>,
    keys: &KeyTable,
) -> Result<u16, AuthError> {
    let value = values.next().ok_or(AuthError::Missing)?;
    if values.next().is_some() {
        return Err(AuthError::Repeated);
    }
    let token = bearer_token(value)?;
    keys.find(&digest(token)).ok_or(AuthError::Unknown)
}

/// Whether a request's `Authorization` header values carry the admin token whose digest is
/// `expected`: exactly one header, `Bearer <token>` or `Basic` with the token as the password
/// (any user name; RFC 7617), so that a browser can open the status page.
pub fn admin_allows<'h>(mut values: impl Iterator<Item = &'h [u8]>, expected: &Digest) -> bool {
    let Some(value) = values.next() else { return false };
    if values.next().is_some() {
        return false;
    }
    let Some((scheme, credentials)) = split_scheme(value) else { return false };
    if scheme.eq_ignore_ascii_case(b"bearer") {
        return credentials.len() <= TOKEN_BYTES_MAX
            && digests_equal(&digest(credentials), expected);
    }
    if !scheme.eq_ignore_ascii_case(b"basic") {
        return false;
    }
    let Some(decoded) = base64_decode(credentials) else { return false };
    let Some(colon) = decoded.iter().position(|&b| b == b':') else { return false };
    digests_equal(&digest(&decoded[colon + 1..]), expected)
}

/// Digests of API keys, each naming its tenant, sorted for a binary search on their first
/// 8 bytes; immutable once built (one per configuration generation).
#[derive(Debug, Clone, Default)]
pub struct KeyTable {
    /// Sorted by (prefix, digest).
    entries: Vec<KeyEntry>,
}

#[derive(Debug, Clone, Copy)]
struct KeyEntry {
    /// The digest's first 8 bytes, big-endian: the search key.
    prefix: u64,
    digest: Digest,
    tenant: u16,
}

/// What a lookup that finds no candidate compares against, so that it makes the same
/// constant-time comparison as one that does.
const STAND_IN: Digest = [0x5a; 32];

fn prefix(digest: &Digest) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_be_bytes(first)
}

impl KeyTable {
    /// A table of `(digest, tenant)` pairs. A digest listed twice keeps one entry per listing
    /// (configuration validation refuses duplicates; the first listed then wins).
    pub fn new(keys: impl IntoIterator<Item = (Digest, u16)>) -> KeyTable {
        let mut entries: Vec<KeyEntry> = keys
            .into_iter()
            .map(|(digest, tenant)| KeyEntry { prefix: prefix(&digest), digest, tenant })
            .collect();
        entries.sort_by_key(|a| (a.prefix, a.digest));
        KeyTable { entries }
    }

    /// Whether the table holds no key (then the main listener is open).
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The tenant whose key has this digest.
    pub fn find(&self, digest: &Digest) -> Option<u16> {
        self.find_counting(digest).0
    }

    /// [`find`](KeyTable::find), and how many whole digests it compared (at least one).
    fn find_counting(&self, digest: &Digest) -> (Option<u16>, usize) {
        let wanted = prefix(digest);
        let start = self.entries.partition_point(|e| e.prefix < wanted);
        let mut found = None;
        let mut compared = 0;
        for entry in self.entries[start..].iter().take_while(|e| e.prefix == wanted) {
            compared += 1;
            if digests_equal(&entry.digest, digest) && found.is_none() {
                found = Some(entry.tenant);
            }
        }
        if compared == 0 {
            compared = 1;
            std::hint::black_box(digests_equal(&STAND_IN, digest));
        }
        (found, compared)
    }
}

/// A new token: [`TOKEN_PREFIX`] and [`TOKEN_RANDOM_BYTES`] bytes of the OS CSPRNG in base64url
/// without padding.
pub fn new_token() -> Result<String, getrandom::Error> {
    let mut random = [0u8; TOKEN_RANDOM_BYTES];
    getrandom::fill(&mut random)?;
    Ok(format!("{TOKEN_PREFIX}{}", base64url(&random)))
}

const BASE64URL: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
const BASE64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// `bytes` in base64url without padding (RFC 4648 section 5).
pub fn base64url(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for group in bytes.chunks(3) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..=group.len() {
            out.push(char::from(BASE64URL[(n >> (18 - 6 * i) & 63) as usize]));
        }
    }
    out
}

/// Standard base64 with padding (RFC 4648 section 4, as `Basic` credentials use it); `None`
/// for anything else.
pub fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    if text.len() % 4 != 0 {
        return None;
    }
    let padding = text.iter().rev().take_while(|&&b| b == b'=').count();
    if padding > 2 {
        return None;
    }
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for (index, quad) in text.chunks_exact(4).enumerate() {
        let last = index == text.len() / 4 - 1;
        let pad = if last { padding } else { 0 };
        let mut n = 0u32;
        for (i, &byte) in quad.iter().enumerate() {
            let value = match byte {
                b'=' if i >= 4 - pad => 0,
                _ => BASE64.iter().position(|&c| c == byte)? as u32,
            };
            n |= value << (18 - 6 * i);
        }
        out.extend_from_slice(&n.to_be_bytes()[1..4 - pad]);
    }
    Some(out)
}

/// The `Authorization` value warmpath sends a model's engines ([`read_backend_key`]), shared by
/// the generation, the shards and the health checks. Its `Debug` shows no byte of it, so a
/// logged or printed structure that holds one does not leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct BackendKey(std::sync::Arc<[u8]>);

impl BackendKey {
    /// The header value, `Bearer <key>`.
    pub fn header_value(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for BackendKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BackendKey(redacted)")
    }
}

/// Longest key [`read_backend_key`] accepts.
pub const BACKEND_KEY_BYTES_MAX: usize = 4096;

/// The `Authorization` value for the engine API key in the file at `path`
/// (`backend_api_key_file`): `Bearer <key>`, the key being the file's content without the
/// whitespace around it (a trailing newline is usual). The key must be 1 to
/// [`BACKEND_KEY_BYTES_MAX`] visible ASCII characters (`!` to `~`): anything else (a space, a
/// control character, a line break inside it) could not travel in a header, or would add header
/// lines of its own. The error names the path and what is wrong, never the content.
pub fn read_backend_key(path: &std::path::Path) -> Result<BackendKey, String> {
    use std::io::Read as _;
    let shown = path.display();
    let file = std::fs::File::open(path).map_err(|e| format!("{shown}: {e}"))?;
    let mut content = Vec::new();
    // Read one byte past the limit (and the whitespace a key may come with), to tell a file
    // that is too long without reading all of it.
    let limit = BACKEND_KEY_BYTES_MAX as u64 + 64;
    file.take(limit + 1).read_to_end(&mut content).map_err(|e| format!("{shown}: {e}"))?;
    let key = content.trim_ascii();
    if key.is_empty() {
        return Err(format!("{shown}: the file holds no key"));
    }
    if content.len() as u64 > limit || key.len() > BACKEND_KEY_BYTES_MAX {
        return Err(format!("{shown}: a key longer than {BACKEND_KEY_BYTES_MAX} bytes"));
    }
    if let Some(at) = key.iter().position(|b| !b.is_ascii_graphic()) {
        return Err(format!(
            "{shown}: byte {} of the key is not a visible ASCII character (a key is one word \
             of `!` to `~`: no spaces, line breaks or control characters)",
            at + 1
        ));
    }
    let mut value = Vec::with_capacity(7 + key.len());
    value.extend_from_slice(b"Bearer ");
    value.extend_from_slice(key);
    Ok(BackendKey(value.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digests_are_sha256_and_hex_round_trips_in_either_case() {
        // FIPS 180-2's example: SHA-256("abc").
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(hex(&digest(b"abc")), abc);
        assert_eq!(parse_hex_digest(abc), Ok(digest(b"abc")));
        assert_eq!(parse_hex_digest(&abc.to_ascii_uppercase()), Ok(digest(b"abc")));
        assert!(parse_hex_digest(&abc[1..]).unwrap_err().contains("found 63 characters"));
        let bad = format!("g{}", &abc[1..]);
        assert!(parse_hex_digest(&bad).unwrap_err().contains("another character"));
        assert!(parse_hex_digest(&format!("{}é", &abc[2..])).is_err());
    }

    #[test]
    fn a_backend_key_file_gives_one_visible_word_and_errors_never_show_it() {
        let path =
            std::env::temp_dir().join(format!("warmpath-backend-key-{}", std::process::id()));
        let read = |content: &[u8]| {
            std::fs::write(&path, content).expect("write the key file");
            read_backend_key(&path).map(|key| key.header_value().to_vec())
        };
        assert_eq!(
            read(b"sk-engine.key_1/2+3=\n").as_deref(),
            Ok(&b"Bearer sk-engine.key_1/2+3="[..])
        );
        assert_eq!(read(b"  \tk\r\n\n").as_deref(), Ok(&b"Bearer k"[..]));
        assert!(read(b"\n \n").unwrap_err().ends_with("the file holds no key"));
        for (content, byte) in [(&b"two words"[..], 4), (b"a\r\nX-Admin: 1", 2), (b"k\x00", 2)] {
            let error = read(content).unwrap_err();
            assert!(error.contains(&format!("byte {byte} of the key")), "{error}");
            assert!(!error.contains("X-Admin") && !error.contains("words"), "{error}");
        }
        let non_ascii = read("clé".as_bytes()).unwrap_err();
        assert!(non_ascii.contains("byte 3 of the key"), "{non_ascii}");
        let longest = vec![b'k'; BACKEND_KEY_BYTES_MAX];
        assert_eq!(read(&longest).map(|v| v.len()), Ok(7 + BACKEND_KEY_BYTES_MAX));
        let key = read_backend_key(&path).expect("the longest key");
        assert_eq!(format!("{key:?}"), "BackendKey(redacted)");
        let long = vec![b'k'; BACKEND_KEY_BYTES_MAX + 1];
        assert!(read(&long).unwrap_err().contains("longer than 4096 bytes"));
        let huge = vec![b'k'; 1 << 20];
        assert!(read(&huge).unwrap_err().contains("longer than 4096 bytes"));
        std::fs::remove_file(&path).expect("remove the key file");
        let missing = read_backend_key(&path).unwrap_err();
        assert!(missing.starts_with(&path.display().to_string()), "{missing}");
    }

    #[test]
    fn bearer_tokens_follow_rfc_6750() {
        assert_eq!(bearer_token(b"Bearer abc"), Ok(&b"abc"[..]));
        assert_eq!(bearer_token(b"  bEaReR   a.b-c_~+/==  "), Ok(&b"a.b-c_~+/=="[..]));
        for malformed in [
            &b""[..],
            b"Bearer",
            b"Bearer ",
            b"Bearer a b",
            b"Bearer a=b",
            b"Bearer ===",
            b"Bearer a\"b",
            b" abc",
        ] {
            assert_eq!(bearer_token(malformed), Err(AuthError::Malformed), "{malformed:?}");
        }
        assert_eq!(bearer_token(b"Basic dTpw"), Err(AuthError::NotBearer));
        assert_eq!(bearer_token(b"Token abc"), Err(AuthError::NotBearer));
        let long = format!("Bearer {}", "a".repeat(TOKEN_BYTES_MAX + 1));
        assert_eq!(bearer_token(long.as_bytes()), Err(AuthError::Malformed));
    }

    fn table() -> KeyTable {
        KeyTable::new([(digest(b"key-a"), 1), (digest(b"key-b"), 2), (digest(b"key-c"), 2)])
    }

    #[test]
    fn authorize_takes_exactly_one_bearer_header_with_a_listed_key() {
        let keys = table();
        let one = |value: &'static [u8]| authorize([value].into_iter(), &keys);
        assert_eq!(one(b"Bearer key-a"), Ok(1));
        assert_eq!(one(b"Bearer key-c"), Ok(2));
        assert_eq!(one(b"Bearer key-d"), Err(AuthError::Unknown));
        assert_eq!(one(b"Basic a2V5LWE="), Err(AuthError::NotBearer));
        assert_eq!(authorize(std::iter::empty(), &keys), Err(AuthError::Missing));
        let two = [&b"Bearer key-a"[..], b"Bearer key-a"];
        assert_eq!(authorize(two.into_iter(), &keys), Err(AuthError::Repeated));
        assert!(KeyTable::default().is_empty() && keys.len() == 3);
    }

    /// The constant-time comparison is on every path: a digest that differs from a stored one
    /// in its first byte (no candidate: the stand-in is compared), in its last byte (the
    /// candidate is compared and fails), or not at all, costs exactly one comparison of 32
    /// bytes. (How long that comparison takes is the bench's business, benches/auth.rs.)
    #[test]
    fn every_lookup_makes_one_whole_digest_comparison() {
        let stored = digest(b"key-a");
        let keys = KeyTable::new([(stored, 7)]);
        let mut first = stored;
        first[0] ^= 1;
        let mut last = stored;
        last[31] ^= 1;
        assert_eq!(keys.find_counting(&stored), (Some(7), 1));
        assert_eq!(keys.find_counting(&first), (None, 1));
        assert_eq!(keys.find_counting(&last), (None, 1));
        assert_eq!(KeyTable::default().find_counting(&stored), (None, 1));
        assert!(!digests_equal(&stored, &last) && !digests_equal(&stored, &first));
        assert!(digests_equal(&stored, &digest(b"key-a")));
        for byte in 0..32 {
            for bit in 0..8 {
                let mut other = stored;
                other[byte] ^= 1 << bit;
                assert!(!digests_equal(&stored, &other), "byte {byte} bit {bit}");
            }
        }
    }

    /// Digests sharing their first 8 bytes (not seen in practice: 2^-64) are all compared.
    #[test]
    fn digests_sharing_a_prefix_are_each_compared() {
        let a = [1u8; 32];
        let mut b = a;
        b[31] = 2;
        let keys = KeyTable::new([(b, 2), (a, 1)]);
        assert_eq!(keys.find_counting(&a), (Some(1), 2));
        assert_eq!(keys.find_counting(&b), (Some(2), 2));
        let many = KeyTable::new((0u16..300).map(|i| (digest(&i.to_le_bytes()), i + 1)));
        for i in 0u16..300 {
            assert_eq!(many.find(&digest(&i.to_le_bytes())), Some(i + 1));
        }
        assert_eq!(many.find(&digest(b"none")), None);
    }

    #[test]
    fn admin_credentials_are_bearer_or_basic_with_the_token_as_password() {
        let expected = digest(b"wp_admin");
        let allows = |value: &'static [u8]| admin_allows([value].into_iter(), &expected);
        assert!(allows(b"Bearer wp_admin"));
        // "anyone:wp_admin" and ":wp_admin".
        assert!(allows(b"Basic YW55b25lOndwX2FkbWlu"));
        assert!(allows(b"basic OndwX2FkbWlu"));
        assert!(!allows(b"Bearer wp_other"));
        // "wp_admin" with no colon: the token as the user name is not the password.
        assert!(!allows(b"Basic d3BfYWRtaW4="));
        assert!(!allows(b"Basic !!!!"));
        assert!(!allows(b"Digest wp_admin"));
        assert!(!admin_allows(std::iter::empty(), &expected));
        let two = [&b"Bearer wp_admin"[..], b"Bearer wp_admin"];
        assert!(!admin_allows(two.into_iter(), &expected));
    }

    #[test]
    fn base64_matches_rfc_4648_vectors() {
        let vectors: [(&[u8], &str, &str); 7] = [
            (b"", "", ""),
            (b"f", "Zg", "Zg=="),
            (b"fo", "Zm8", "Zm8="),
            (b"foo", "Zm9v", "Zm9v"),
            (b"foob", "Zm9vYg", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy", "Zm9vYmFy"),
        ];
        for (plain, url, padded) in vectors {
            assert_eq!(base64url(plain), url);
            assert_eq!(base64_decode(padded.as_bytes()).as_deref(), Some(plain), "{padded}");
        }
        assert_eq!(base64url(&[0xfb, 0xff]), "-_8");
        assert_eq!(base64_decode(b"+/8="), Some(vec![0xfb, 0xff]));
        for bad in [&b"Zg="[..], b"Z===", b"Zg==Zg==", b"Zm9v-_==", b"=Zm9"] {
            assert_eq!(base64_decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn new_tokens_are_prefixed_base64url_of_32_random_bytes() {
        let a = new_token().unwrap();
        let b = new_token().unwrap();
        assert_ne!(a, b);
        let random = a.strip_prefix(TOKEN_PREFIX).unwrap();
        assert_eq!(random.len(), 43, "32 bytes in base64url without padding");
        assert!(random.bytes().all(|c| BASE64URL.contains(&c)));
        assert!(bearer_token(format!("Bearer {a}").as_bytes()).is_ok());
    }
}
