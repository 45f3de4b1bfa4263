//! HTTP/1.1 framing shared by the fake backend and the test client: a socket with a read
//! buffer that keeps leftover bytes (pipelining), heads parsed with httparse, and bodies by
//! `Content-Length` or chunked.

use std::io::{self, Read, Write};
use std::net::TcpStream;

/// Header lines kept per head (requests from the router, responses from it).
const HEADERS_MAX: usize = 128;

/// One parsed request or response head; header names keep their spelling.
#[derive(Debug, Clone, Default)]
pub struct Head {
    /// `GET`, `POST`, … (requests only).
    pub method: String,
    /// Request target (requests only).
    pub target: String,
    /// Status code (responses only).
    pub status: u16,
    /// Header lines in order.
    pub headers: Vec<(String, String)>,
}

impl Head {
    /// The first value of `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        header(&self.headers, name)
    }

    /// How the body that follows is framed.
    pub fn framing(&self) -> Framing {
        let chunked = self.header("transfer-encoding").is_some_and(|te| te.contains("chunked"));
        if chunked {
            return Framing::Chunked;
        }
        match self.header("content-length") {
            Some(length) => Framing::Length(length.trim().parse().expect("numeric Content-Length")),
            None => Framing::Close,
        }
    }
}

/// Body framing of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// `Content-Length`.
    Length(usize),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Neither: a response delimited by the connection closing (a request without a body).
    Close,
}

/// The first value of `name` in `headers` (case-insensitive).
pub fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
}

/// Every value of `name` in `headers`, in order.
pub fn header_all<'a>(headers: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()).collect()
}

/// A socket and the bytes read from it but not yet consumed.
#[derive(Debug)]
pub struct Wire {
    /// The socket.
    pub stream: TcpStream,
    /// Read, not yet consumed.
    pub buf: Vec<u8>,
}

impl Wire {
    /// Wraps `stream`.
    pub fn new(stream: TcpStream) -> Wire {
        Wire { stream, buf: Vec::new() }
    }

    /// One `read` appended to the buffer; `Ok(0)` at end of stream.
    pub fn fill(&mut self) -> io::Result<usize> {
        let mut chunk = [0u8; 16 << 10];
        let n = loop {
            match self.stream.read(&mut chunk) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => break other?,
            }
        };
        self.buf.extend_from_slice(&chunk[..n]);
        Ok(n)
    }

    /// Like [`fill`](Self::fill) but end of stream is an `UnexpectedEof` error.
    fn fill_more(&mut self) -> io::Result<()> {
        if self.fill()? == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed"));
        }
        Ok(())
    }

    /// Writes all of `bytes`.
    pub fn send(&mut self, bytes: &[u8]) -> io::Result<()> {
        self.stream.write_all(bytes)?;
        self.stream.flush()
    }

    /// Reads a request head; `Ok(None)` when the peer closed before sending a byte of it.
    pub fn read_request_head(&mut self) -> io::Result<Option<Head>> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
            let mut request = httparse::Request::new(&mut headers);
            match request.parse(&self.buf).map_err(invalid)? {
                httparse::Status::Complete(len) => {
                    let head = Head {
                        method: request.method.unwrap_or("").to_owned(),
                        target: request.path.unwrap_or("").to_owned(),
                        status: 0,
                        headers: owned(request.headers),
                    };
                    self.buf.drain(..len);
                    return Ok(Some(head));
                }
                httparse::Status::Partial => {
                    if self.fill()? == 0 {
                        if self.buf.is_empty() {
                            return Ok(None);
                        }
                        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "partial head"));
                    }
                }
            }
        }
    }

    /// Reads a response head, skipping interim (1xx) responses.
    pub fn read_response_head(&mut self) -> io::Result<Head> {
        loop {
            let mut headers = [httparse::EMPTY_HEADER; HEADERS_MAX];
            let mut response = httparse::Response::new(&mut headers);
            match response.parse(&self.buf).map_err(invalid)? {
                httparse::Status::Complete(len) => {
                    let head = Head {
                        method: String::new(),
                        target: String::new(),
                        status: response.code.unwrap_or(0),
                        headers: owned(response.headers),
                    };
                    self.buf.drain(..len);
                    if (100..200).contains(&head.status) && head.status != 101 {
                        continue;
                    }
                    return Ok(head);
                }
                httparse::Status::Partial => self.fill_more()?,
            }
        }
    }

    /// Exactly `n` bytes.
    pub fn take(&mut self, n: usize) -> io::Result<Vec<u8>> {
        while self.buf.len() < n {
            self.fill_more()?;
        }
        Ok(self.buf.drain(..n).collect())
    }

    /// Everything until the peer closes.
    pub fn read_to_end(&mut self) -> io::Result<Vec<u8>> {
        while self.fill()? > 0 {}
        Ok(std::mem::take(&mut self.buf))
    }

    /// The next chunk's data; `Ok(None)` after the last chunk and its (empty or not) trailers.
    pub fn chunk(&mut self) -> io::Result<Option<Vec<u8>>> {
        let size = loop {
            match httparse::parse_chunk_size(&self.buf) {
                Ok(httparse::Status::Complete((len, size))) => {
                    self.buf.drain(..len);
                    break usize::try_from(size).map_err(invalid)?;
                }
                Ok(httparse::Status::Partial) => self.fill_more()?,
                Err(_) => return Err(invalid("bad chunk size line")),
            }
        };
        if size == 0 {
            // Trailers: lines until an empty one.
            loop {
                let line = self.line()?;
                if line.is_empty() {
                    return Ok(None);
                }
            }
        }
        let data = self.take(size)?;
        if self.take(2)? != b"\r\n" {
            return Err(invalid("chunk data not followed by CRLF"));
        }
        Ok(Some(data))
    }

    /// A whole chunked body.
    pub fn read_chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        while let Some(data) = self.chunk()? {
            body.extend_from_slice(&data);
        }
        Ok(body)
    }

    /// A line without its CRLF.
    fn line(&mut self) -> io::Result<Vec<u8>> {
        loop {
            if let Some(end) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = self.buf[..end].to_vec();
                self.buf.drain(..end + 2);
                return Ok(line);
            }
            self.fill_more()?;
        }
    }

    /// The body of a message with `framing` (a `Close` body is read to the end).
    pub fn read_body(&mut self, framing: Framing) -> io::Result<Vec<u8>> {
        match framing {
            Framing::Length(n) => self.take(n),
            Framing::Chunked => self.read_chunked(),
            Framing::Close => self.read_to_end(),
        }
    }
}

fn owned(headers: &[httparse::Header<'_>]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|h| (h.name.to_owned(), String::from_utf8_lossy(h.value).into_owned()))
        .collect()
}

fn invalid(error: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, error.to_string())
}

/// `data` as one chunk of a chunked body.
pub fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}
