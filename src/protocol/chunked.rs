//! The chunked transfer coding of RFC 9112 section 7.1: an incremental decoder and an encoder.
//!
//! ```text
//! chunked-body = *chunk last-chunk trailer-section CRLF
//! chunk        = chunk-size [ chunk-ext ] CRLF chunk-data CRLF
//! last-chunk   = 1*"0" [ chunk-ext ] CRLF
//! chunk-ext    = *( BWS ";" BWS chunk-ext-name [ BWS "=" BWS chunk-ext-val ] )
//! ```
//!
//! [`ChunkedDecoder`] is a byte-driven state machine: any split of the input gives the same
//! result, down to one byte per call. Chunk data is copied in bulk; everything else is read a
//! byte at a time. It is strict where lenience has enabled request smuggling: every line ends in
//! CRLF (a bare LF is an error, RFC 9112 2.2 lets us refuse it), sizes are 1 to 16 hex digits, a
//! chunk-size line (size plus extensions) and the trailer section are bounded, extensions and
//! trailer fields are ignored (extensions may hold HTAB, visible ASCII and obs-text; a trailer
//! line must start with a token character), and the decoded total is checked against
//! `max_body_bytes` as soon as each chunk's size is known. It stops at the end of the body, so
//! pipelined bytes after it stay with the caller.
//!
//! Upstream chunked responses go through the same state machine in its pass-through form,
//! [`ChunkedDecoder::pass`], when the client takes chunked too (SPEC 2.7): the body is copied
//! as the backend framed it, read by read, while the machine steps over each size line and skips
//! each chunk's data by its size. It checks the same grammar and limits, so a malformed upstream
//! body is refused before its bad piece reaches the client, and it leaves out chunk extensions
//! and trailer fields, so the router never forwards those. [`ChunkedEncoder`] frames bodies
//! that arrive unchunked (close-delimited) for an HTTP/1.1 client.

use super::error::{ErrorKind, ProtocolError};
use super::Side;

/// Limits of one chunked body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkedLimits {
    /// Most decoded bytes (413 for a request).
    pub max_body_bytes: u64,
    /// Longest chunk-size line: size digits, whitespace and extensions, CRLF excluded.
    pub max_line_bytes: usize,
    /// Longest trailer section, field lines and their CRLFs (the final CRLF excluded).
    pub max_trailer_bytes: usize,
}

/// What one [`ChunkedDecoder::feed`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Progress {
    /// Input bytes consumed. Less than the input only when `done`: the rest is not this body's.
    pub consumed: usize,
    /// The final CRLF has been read: the body is complete.
    pub done: bool,
}

/// What one [`ChunkedDecoder::pass`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Passed {
    /// Input bytes consumed. Less than the input only when `done`: the rest is not this body's.
    pub consumed: usize,
    /// The final CRLF has been read: the body is complete.
    pub done: bool,
    /// Chunk data bytes among the consumed ones.
    pub data: usize,
}

/// Where the decoder is in the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size.
    Size,
    /// Whitespace after the size: only more whitespace or `;` may follow.
    SizeSpace,
    /// Inside chunk extensions, until CR.
    Extension,
    /// After the CR of a chunk-size line.
    SizeLf,
    /// Copying chunk data.
    Data,
    /// Expecting the CR after chunk data.
    DataCr,
    /// Expecting the LF after chunk data.
    DataLf,
    /// At the start of a trailer line (or of the final CRLF).
    TrailerStart,
    /// Inside a trailer field line, until CR.
    TrailerLine,
    /// After the CR of a trailer field line.
    TrailerLf,
    /// After the CR of the final empty line.
    EndLf,
    /// The body is complete.
    Done,
}

/// Incremental decoder of a chunked body: feed it bytes as they arrive.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    limits: ChunkedLimits,
    side: Side,
    state: State,
    /// Digits read of the current size.
    digits: u8,
    /// The current chunk's size, then its bytes still to copy.
    size: u64,
    /// Bytes of the current chunk-size line.
    line_bytes: usize,
    /// Bytes of the trailer section so far.
    trailer_bytes: usize,
    /// Decoded bytes so far, all chunks.
    total: u64,
}

impl ChunkedDecoder {
    /// A decoder of a body sent by `side` (which decides the error statuses).
    pub fn new(limits: ChunkedLimits, side: Side) -> Self {
        Self {
            limits,
            side,
            state: State::Size,
            digits: 0,
            size: 0,
            line_bytes: 0,
            trailer_bytes: 0,
            total: 0,
        }
    }

    /// Decoded bytes so far.
    pub fn decoded_bytes(&self) -> u64 {
        self.total
    }

    /// Whether the whole body has been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decodes from `input`, appending chunk data to `out`. Consumes all of `input` unless the
    /// body ends inside it. After an error the decoder must not be fed again.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<Progress, ProtocolError> {
        let mut pos = 0;
        while pos < input.len() && self.state != State::Done {
            if self.state == State::Data {
                let available = input.len() - pos;
                let take = usize::try_from(self.size).map_or(available, |s| s.min(available));
                out.extend_from_slice(&input[pos..pos + take]);
                pos += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
            } else {
                self.step(input[pos])?;
                pos += 1;
            }
        }
        Ok(Progress { consumed: pos, done: self.state == State::Done })
    }

    /// Passes a chunked body through: appends `input`'s chunk-size lines, chunk data and CRLFs
    /// to `out` as they are, without their extensions, and the last chunk without its trailer
    /// fields, while checking the same grammar and limits as [`ChunkedDecoder::feed`]. Chunk
    /// data is skipped over (its size is known), not copied twice: `out` gets each run of kept
    /// bytes in one copy, the whole input when it holds no extension or trailer. `data` counts
    /// the chunk data bytes in the input. On an error nothing of this input is appended.
    pub fn pass(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<Passed, ProtocolError> {
        let (start, mut pos, mut kept_from, mut data) = (out.len(), 0, 0, 0);
        while pos < input.len() && self.state != State::Done {
            if self.state == State::Data {
                let available = input.len() - pos;
                let take = usize::try_from(self.size).map_or(available, |s| s.min(available));
                pos += take;
                data += take;
                self.size -= take as u64;
                if self.size == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            if let Some(n) = self.whole_line(&input[pos..]) {
                pos += n;
                continue;
            }
            let b = input[pos];
            let dropped = self.drops(b);
            if let Err(e) = self.step(b) {
                out.truncate(start);
                return Err(e);
            }
            if dropped {
                out.extend_from_slice(&input[kept_from..pos]);
                kept_from = pos + 1;
            }
            pos += 1;
        }
        out.extend_from_slice(&input[kept_from..pos]);
        Ok(Passed { consumed: pos, done: self.state == State::Done, data })
    }

    /// The common framing taken whole rather than a byte at a time: the CRLF after a chunk's
    /// data, or a complete size line of digits alone (`1a2\r\n`) for a chunk the limits allow.
    /// Returns the bytes taken, `None` to leave the input to [`ChunkedDecoder::step`] (anything
    /// else, cut or wrong, is judged there, byte by byte, as before).
    fn whole_line(&mut self, rest: &[u8]) -> Option<usize> {
        match self.state {
            State::DataCr if rest.starts_with(b"\r\n") => {
                self.state = State::Size;
                self.digits = 0;
                self.line_bytes = 0;
                Some(2)
            }
            State::Size if self.digits == 0 => {
                let n = rest.iter().take(17).take_while(|b| b.is_ascii_hexdigit()).count();
                if n == 0 || n > 16 || n > self.limits.max_line_bytes {
                    return None;
                }
                if rest.get(n..n + 2) != Some(b"\r\n".as_slice()) {
                    return None;
                }
                let size = rest[..n].iter().fold(0u64, |v, &d| v << 4 | u64::from(hex_value(d)));
                let total =
                    self.total.checked_add(size).filter(|t| *t <= self.limits.max_body_bytes);
                let (Some(total), true) = (total, size > 0) else { return None };
                self.total = total;
                self.size = size;
                self.state = State::Data;
                Some(n + 2)
            }
            _ => None,
        }
    }

    /// Whether byte `b`, read in the current state, is left out when passing the body through:
    /// a chunk extension (from the whitespace or `;` after the size up to the CR) or a trailer
    /// field line (with its CRLF).
    fn drops(&self, b: u8) -> bool {
        match self.state {
            State::Size => matches!(b, b' ' | b'\t' | b';'),
            State::SizeSpace | State::Extension | State::TrailerStart => b != b'\r',
            State::TrailerLine | State::TrailerLf => true,
            _ => false,
        }
    }

    fn error(&self, kind: ErrorKind) -> ProtocolError {
        ProtocolError::new(kind, self.side)
    }

    /// One byte outside chunk data.
    fn step(&mut self, b: u8) -> Result<(), ProtocolError> {
        match self.state {
            State::Size | State::SizeSpace | State::Extension => self.size_line(b),
            State::SizeLf => self.size_line_end(b),
            State::DataCr => self.expect(b, b'\r', State::DataLf, ErrorKind::InvalidChunkFraming),
            State::DataLf => {
                self.expect(b, b'\n', State::Size, ErrorKind::InvalidChunkFraming)?;
                self.digits = 0;
                self.line_bytes = 0;
                Ok(())
            }
            State::TrailerStart | State::TrailerLine | State::TrailerLf => self.trailer(b),
            State::EndLf => self.expect(b, b'\n', State::Done, ErrorKind::InvalidTrailer),
            State::Data | State::Done => unreachable!("handled by feed"),
        }
    }

    fn expect(
        &mut self,
        b: u8,
        want: u8,
        next: State,
        kind: ErrorKind,
    ) -> Result<(), ProtocolError> {
        if b != want {
            return Err(self.error(kind));
        }
        self.state = next;
        Ok(())
    }

    /// A byte of a chunk-size line before its CR.
    fn size_line(&mut self, b: u8) -> Result<(), ProtocolError> {
        if b == b'\r' {
            if self.digits == 0 {
                return Err(self.error(ErrorKind::InvalidChunkSize));
            }
            if self.state == State::SizeSpace {
                return Err(self.error(ErrorKind::InvalidChunkExtension));
            }
            self.state = State::SizeLf;
            return Ok(());
        }
        self.line_bytes += 1;
        if self.line_bytes > self.limits.max_line_bytes {
            return Err(self.error(ErrorKind::InvalidChunkExtension));
        }
        match (self.state, b) {
            (State::Size, _) if b.is_ascii_hexdigit() => {
                if self.digits == 16 {
                    return Err(self.error(ErrorKind::InvalidChunkSize));
                }
                self.digits += 1;
                self.size = (self.size << 4) | u64::from(hex_value(b));
                Ok(())
            }
            (State::Size, b';' | b' ' | b'\t') if self.digits == 0 => {
                Err(self.error(ErrorKind::InvalidChunkSize))
            }
            (State::Size | State::SizeSpace, b' ' | b'\t') => {
                self.state = State::SizeSpace;
                Ok(())
            }
            (State::Size | State::SizeSpace, b';') => {
                self.state = State::Extension;
                Ok(())
            }
            (State::Size, _) => Err(self.error(ErrorKind::InvalidChunkSize)),
            (State::Extension, _) if b == b'\t' || b >= 0x20 && b != 0x7f => Ok(()),
            _ => Err(self.error(ErrorKind::InvalidChunkExtension)),
        }
    }

    /// The LF of a chunk-size line: start the chunk's data, or the trailer after the last chunk.
    fn size_line_end(&mut self, b: u8) -> Result<(), ProtocolError> {
        if b != b'\n' {
            return Err(self.error(ErrorKind::InvalidChunkFraming));
        }
        if self.size == 0 {
            self.state = State::TrailerStart;
            return Ok(());
        }
        self.total = self
            .total
            .checked_add(self.size)
            .filter(|t| *t <= self.limits.max_body_bytes)
            .ok_or(self.error(ErrorKind::BodyTooLarge))?;
        self.state = State::Data;
        Ok(())
    }

    /// A byte of the trailer section.
    fn trailer(&mut self, b: u8) -> Result<(), ProtocolError> {
        if self.state == State::TrailerStart && b == b'\r' {
            self.state = State::EndLf;
            return Ok(());
        }
        self.trailer_bytes += 1;
        if self.trailer_bytes > self.limits.max_trailer_bytes {
            return Err(self.error(ErrorKind::InvalidTrailer));
        }
        let next = match (self.state, b) {
            (State::TrailerStart, _) if is_token_char(b) => State::TrailerLine,
            (State::TrailerLine, b'\r') => State::TrailerLf,
            (State::TrailerLine, _) if b == b'\t' || b >= 0x20 && b != 0x7f => State::TrailerLine,
            (State::TrailerLf, b'\n') => State::TrailerStart,
            _ => return Err(self.error(ErrorKind::InvalidTrailer)),
        };
        self.state = next;
        Ok(())
    }
}

/// The value of an ASCII hex digit.
fn hex_value(b: u8) -> u8 {
    match b {
        b'0'..=b'9' => b - b'0',
        b'a'..=b'f' => b - b'a' + 10,
        b'A'..=b'F' => b - b'A' + 10,
        _ => unreachable!("checked by the caller"),
    }
}

/// RFC 9110 `tchar`.
pub(super) fn is_token_char(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Frames data in the chunked coding, for relaying bodies of unknown length to HTTP/1.1 clients.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChunkedEncoder;

impl ChunkedEncoder {
    /// Appends the size line of a chunk of `len` bytes (`len` must not be 0: that would end the
    /// body). Follow it with the data and [`ChunkedEncoder::CHUNK_END`]; this split lets a
    /// caller write the data from its own buffer without copying.
    pub fn chunk_header(len: usize, out: &mut Vec<u8>) {
        debug_assert!(len > 0, "an empty chunk would end the body");
        let mut digits = [0u8; 16];
        let mut i = digits.len();
        let mut n = len;
        loop {
            i -= 1;
            digits[i] = b"0123456789abcdef"[n & 0xf];
            n >>= 4;
            if n == 0 {
                break;
            }
        }
        out.extend_from_slice(&digits[i..]);
        out.extend_from_slice(b"\r\n");
    }

    /// The CRLF after a chunk's data.
    pub const CHUNK_END: &'static [u8] = b"\r\n";

    /// The last chunk and the empty trailer section.
    pub const LAST_CHUNK: &'static [u8] = b"0\r\n\r\n";

    /// Appends `data` as one chunk; nothing when `data` is empty.
    pub fn chunk(data: &[u8], out: &mut Vec<u8>) {
        if data.is_empty() {
            return;
        }
        Self::chunk_header(data.len(), out);
        out.extend_from_slice(data);
        out.extend_from_slice(Self::CHUNK_END);
    }

    /// Appends the end of the body.
    pub fn finish(out: &mut Vec<u8>) {
        out.extend_from_slice(Self::LAST_CHUNK);
    }
}

#[cfg(test)]
#[path = "chunked_tests.rs"]
mod tests;
