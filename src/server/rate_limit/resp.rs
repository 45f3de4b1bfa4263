//! A small Redis client for the rate-limit store: RESP2 (the Redis serialization protocol,
//! <https://redis.io/docs/latest/develop/reference/protocol-spec/>) over a blocking
//! `std::net::TcpStream` with connect, read and write timeouts, and `redis://` URLs.
//!
//! Why not the `redis` crate: the store sends three commands (`AUTH`, `SELECT`, `EVALSHA` /
//! `EVAL`) from one background thread and never from the request path. The crate brings a
//! connection manager, a URL parser and its own dependency tree for that; what the store needs
//! is a timeout on every socket operation (so that a Redis that accepts and never answers costs
//! one timeout per sync, not a stuck thread), which std's socket gives directly. The reply
//! parser ([`parse`]) is sans-IO: it reads a complete reply from a byte slice or says it needs
//! more, so it is tested on split and hostile input without a server.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

/// Longest reply accepted (a sync's reply is a few bytes per tenant).
pub const REPLY_BYTES_MAX: usize = 4 << 20;
/// Deepest nesting of arrays accepted.
const DEPTH_MAX: usize = 4;

/// A parsed `redis://[[user]:password@]host[:port][/db]` (validated by `config::validate`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedisUrl {
    /// `host:port` (port 6379 when absent), brackets kept for IPv6.
    pub address: String,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: u32,
}

impl RedisUrl {
    /// Parses a URL the configuration accepted; percent-escapes in the user and password are
    /// decoded.
    pub fn parse(url: &str) -> Result<RedisUrl, String> {
        let rest = url.strip_prefix("redis://").ok_or("expected a redis:// URL")?;
        let (authority, db) = rest.split_once('/').unwrap_or((rest, ""));
        let db = match db {
            "" => 0,
            db => db.parse().map_err(|_| format!("database {db:?} is not a number"))?,
        };
        let (credentials, host) = match authority.rsplit_once('@') {
            Some((credentials, host)) => (Some(credentials), host),
            None => (None, authority),
        };
        let (user, password) = match credentials.map(|c| c.split_once(':').unwrap_or(("", c))) {
            Some((user, password)) => {
                let user = (!user.is_empty()).then(|| percent_decode(user));
                (user, Some(percent_decode(password)))
            }
            None => (None, None),
        };
        let has_port = match host.strip_prefix('[') {
            Some(bracketed) => bracketed.contains("]:"),
            None => host.contains(':'),
        };
        let address = if has_port { host.to_owned() } else { format!("{host}:6379") };
        Ok(RedisUrl { address, user, password, db })
    }
}

/// `%XX` escapes decoded (an invalid one is kept as written).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok());
        match (bytes[i], hex.and_then(|h| u8::from_str_radix(h, 16).ok())) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A RESP2 reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...`: the server refused the command.
    Error(String),
    Integer(i64),
    /// `$n`; `None` for the null bulk string `$-1`.
    Bulk(Option<Vec<u8>>),
    /// `*n`; `None` for the null array `*-1`.
    Array(Option<Vec<Reply>>),
}

/// Reads one complete reply at the start of `buf`: the reply and the bytes it took, or `None`
/// when `buf` holds only part of one. A malformed reply is an error.
pub fn parse(buf: &[u8]) -> Result<Option<(Reply, usize)>, String> {
    parse_at(buf, 0, 0)
}

fn parse_at(buf: &[u8], at: usize, depth: usize) -> Result<Option<(Reply, usize)>, String> {
    let Some(line_end) = find_crlf(buf, at) else {
        return match buf.len() - at > 1024 {
            true => Err("a reply line over 1 KiB".to_owned()),
            false => Ok(None),
        };
    };
    if line_end - at > 1024 {
        return Err("a reply line over 1 KiB".to_owned());
    }
    let Some((&kind, line)) = buf[at..line_end].split_first() else {
        return Err("an empty reply line".to_owned());
    };
    let text = || String::from_utf8_lossy(line).into_owned();
    let next = line_end + 2;
    let reply = match kind {
        b'+' => Reply::Simple(text()),
        b'-' => Reply::Error(text()),
        b':' => Reply::Integer(integer(line)?),
        b'$' => {
            let len = integer(line)?;
            if len < 0 {
                return Ok(Some((Reply::Bulk(None), next)));
            }
            let len = usize::try_from(len).map_err(|_| "a bulk length".to_owned())?;
            if len > REPLY_BYTES_MAX {
                return Err(format!("a bulk string of {len} bytes"));
            }
            if buf.len() < next + len + 2 {
                return Ok(None);
            }
            if &buf[next + len..next + len + 2] != b"\r\n" {
                return Err("a bulk string without its CRLF".to_owned());
            }
            return Ok(Some((Reply::Bulk(Some(buf[next..next + len].to_vec())), next + len + 2)));
        }
        b'*' => return array(buf, line, next, depth),
        other => return Err(format!("an unknown reply type {:?}", other as char)),
    };
    Ok(Some((reply, next)))
}

/// An array's elements after its header line (`line`, ending before `at`).
fn array(
    buf: &[u8],
    line: &[u8],
    mut at: usize,
    depth: usize,
) -> Result<Option<(Reply, usize)>, String> {
    let len = integer(line)?;
    if len < 0 {
        return Ok(Some((Reply::Array(None), at)));
    }
    if depth == DEPTH_MAX {
        return Err("arrays nested too deep".to_owned());
    }
    let len = usize::try_from(len).map_err(|_| "an array length".to_owned())?;
    if len > REPLY_BYTES_MAX / 4 {
        return Err(format!("an array of {len} elements"));
    }
    let mut items = Vec::with_capacity(len.min(1024));
    for _ in 0..len {
        match parse_at(buf, at, depth + 1)? {
            Some((item, end)) => {
                items.push(item);
                at = end;
            }
            None => return Ok(None),
        }
    }
    Ok(Some((Reply::Array(Some(items)), at)))
}

fn find_crlf(buf: &[u8], from: usize) -> Option<usize> {
    memchr::memmem::find(&buf[from..], b"\r\n").map(|i| from + i)
}

/// A RESP integer: an optional `-` and 1 to 19 digits.
fn integer(line: &[u8]) -> Result<i64, String> {
    let (negative, digits) = match line.split_first() {
        Some((b'-', rest)) => (true, rest),
        _ => (false, line),
    };
    if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
        return Err(format!("{:?} is not an integer", String::from_utf8_lossy(line)));
    }
    let value: i64 = std::str::from_utf8(digits)
        .expect("ASCII digits")
        .parse()
        .map_err(|_| "an integer out of range".to_owned())?;
    Ok(if negative { -value } else { value })
}

/// Appends a command as a RESP array of bulk strings.
pub fn encode(args: &[&[u8]], out: &mut Vec<u8>) {
    out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
    for arg in args {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
}

/// A connection to Redis whose every socket operation has a deadline of `timeout`.
#[derive(Debug)]
pub struct Connection {
    stream: TcpStream,
    out: Vec<u8>,
    input: Vec<u8>,
}

impl Connection {
    /// Connects (each resolved address in turn, `timeout` each), then authenticates and
    /// selects the database when the URL says so.
    pub fn open(url: &RedisUrl, timeout: Duration) -> io::Result<Connection> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, "the host resolved to nothing");
        for addr in url.address.to_socket_addrs()? {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(stream) => {
                    stream.set_read_timeout(Some(timeout))?;
                    stream.set_write_timeout(Some(timeout))?;
                    stream.set_nodelay(true)?;
                    let mut conn = Connection { stream, out: Vec::new(), input: Vec::new() };
                    conn.handshake(url)?;
                    return Ok(conn);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn handshake(&mut self, url: &RedisUrl) -> io::Result<()> {
        if let Some(password) = &url.password {
            let reply = match &url.user {
                Some(user) => self.command(&[b"AUTH", user.as_bytes(), password.as_bytes()])?,
                None => self.command(&[b"AUTH", password.as_bytes()])?,
            };
            expect_ok(reply, "AUTH")?;
        }
        if url.db != 0 {
            let db = url.db.to_string();
            expect_ok(self.command(&[b"SELECT", db.as_bytes()])?, "SELECT")?;
        }
        Ok(())
    }

    /// Sends one command and reads its reply (an `Error` reply is returned, not failed).
    pub fn command(&mut self, args: &[&[u8]]) -> io::Result<Reply> {
        self.out.clear();
        encode(args, &mut self.out);
        self.stream.write_all(&self.out)?;
        self.input.clear();
        let mut chunk = [0u8; 4096];
        loop {
            match parse(&self.input).map_err(io::Error::other)? {
                Some((reply, _)) => return Ok(reply),
                None if self.input.len() > REPLY_BYTES_MAX => {
                    return Err(io::Error::other("a reply over the size limit"));
                }
                None => {}
            }
            let n = self.stream.read(&mut chunk)?;
            if n == 0 {
                return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "Redis closed"));
            }
            self.input.extend_from_slice(&chunk[..n]);
        }
    }
}

/// Fuzz and test check (the `resp` fuzz target): [`parse`] never panics; a reply it reads
/// whole from `data` (`n` bytes) it reads the same from exactly those `n` bytes, and every
/// shorter prefix asks for more or is refused, never a different reply; what it refuses whole
/// no prefix makes it accept as a reply of the same length.
#[cfg(any(test, fuzzing))]
pub fn check_parse(data: &[u8]) {
    let whole = parse(data);
    if let Ok(Some((reply, n))) = &whole {
        assert_eq!(parse(&data[..*n]).as_ref().ok(), Some(&Some((reply.clone(), *n))));
        for cut in [0, n / 2, n.saturating_sub(1)] {
            if cut < *n {
                assert!(!matches!(parse(&data[..cut]), Ok(Some(_))), "a prefix of {cut} bytes");
            }
        }
    }
}

fn expect_ok(reply: Reply, command: &str) -> io::Result<()> {
    match reply {
        Reply::Simple(_) => Ok(()),
        other => Err(io::Error::other(format!("{command} refused: {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_address_credentials_and_database() {
        let url = RedisUrl::parse("redis://user:p%40ss@[::1]:6380/2").unwrap();
        assert_eq!(url.address, "[::1]:6380");
        assert_eq!((url.user.as_deref(), url.password.as_deref()), (Some("user"), Some("p@ss")));
        assert_eq!(url.db, 2);
        let url = RedisUrl::parse("redis://:secret@cache.internal").unwrap();
        assert_eq!(url.address, "cache.internal:6379");
        assert_eq!((url.user, url.password.as_deref(), url.db), (None, Some("secret"), 0));
        assert_eq!(RedisUrl::parse("redis://[::1]").unwrap().address, "[::1]:6379");
        assert!(RedisUrl::parse("http://h").is_err());
    }

    /// Every reply parses whole, and every proper prefix asks for more.
    #[test]
    fn replies_parse_and_prefixes_wait() {
        let cases: [(&[u8], Reply); 6] = [
            (b"+OK\r\n", Reply::Simple("OK".into())),
            (
                b"-NOSCRIPT No matching script\r\n",
                Reply::Error("NOSCRIPT No matching script".into()),
            ),
            (b":-42\r\n", Reply::Integer(-42)),
            (b"$3\r\na\r\n\r\n", Reply::Bulk(Some(b"a\r\n".to_vec()))),
            (b"$-1\r\n", Reply::Bulk(None)),
            (
                b"*3\r\n:1\r\n:0\r\n*1\r\n$0\r\n\r\n",
                Reply::Array(Some(vec![
                    Reply::Integer(1),
                    Reply::Integer(0),
                    Reply::Array(Some(vec![Reply::Bulk(Some(Vec::new()))])),
                ])),
            ),
        ];
        for (bytes, reply) in cases {
            assert_eq!(parse(bytes), Ok(Some((reply, bytes.len()))));
            for cut in 0..bytes.len() {
                assert_eq!(parse(&bytes[..cut]), Ok(None), "{bytes:?} cut at {cut}");
            }
        }
    }

    #[test]
    fn hostile_replies_are_errors() {
        for bad in [
            &b"?x\r\n"[..],
            b"\r\n",
            b":12x\r\n",
            b":99999999999999999999\r\n",
            b"$5\r\nabcdefg",
            b"$99999999999\r\n",
            b"*99999999999\r\n",
            b"*1\r\n*1\r\n*1\r\n*1\r\n*1\r\n:1\r\n",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(parse(&[b'+'; 2000]).is_err(), "a line without an end is bounded");
        check_parse(b"*2\r\n:1\r\n$2\r\nab\r\n+OK\r\n");
        let mut out = Vec::new();
        encode(&[b"GET", b"k"], &mut out);
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$1\r\nk\r\n");
    }
}
