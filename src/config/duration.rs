//! Go-style duration strings (`"500ms"`, `"1m30s"`, `"1.5s"`), as accepted by Go's
//! `time.ParseDuration`, so settings carry over from kthena unchanged.
//!
//! Grammar: `"0"`, or one or more `<decimal><unit>` terms, where a decimal is digits with an
//! optional fraction (`"1.5"`, `".5"`, `"1."`) and a unit is one of `ns`, `us` (also `µs` and
//! `μs`), `ms`, `s`, `m`, `h`. Terms add up: `"1h30m"` is 90 minutes. Unlike Go, a sign is
//! refused (no configuration value may be negative) and the total must fit in `u64`
//! nanoseconds (about 584 years). Fractions are truncated to whole nanoseconds, as in Go.
//!
//! [`format_duration`] writes the inverse: the largest unit that divides the value exactly, so
//! `parse_duration(&format_duration(d)) == Ok(d)` for every `d` below `u64::MAX` nanoseconds.

use std::fmt;
use std::time::Duration;

/// Why a duration string was refused. Its `Display` is the reason only; the caller names the
/// key and the value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DurationError {
    /// The string is empty (or only whitespace).
    Empty,
    /// The string starts with `-` or `+`.
    Signed,
    /// A term has no digits where a number was expected.
    ExpectedNumber,
    /// A number has no unit after it (only `"0"` may stand alone).
    MissingUnit,
    /// A unit that is not one of `ns us µs μs ms s m h`.
    UnknownUnit,
    /// The total exceeds `u64::MAX` nanoseconds.
    Overflow,
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let reason = match self {
            DurationError::Empty => "empty duration",
            DurationError::Signed => "a duration takes no sign",
            DurationError::ExpectedNumber => "expected a number",
            DurationError::MissingUnit => "missing unit",
            DurationError::UnknownUnit => "unknown unit",
            DurationError::Overflow => "duration too large",
        };
        f.write_str(reason)?;
        f.write_str(" (expected a duration such as \"500ms\", \"30s\", \"1m30s\";")?;
        f.write_str(" units ns, us, ms, s, m, h)")
    }
}

impl std::error::Error for DurationError {}

const NANOS_PER_US: u128 = 1_000;
const NANOS_PER_MS: u128 = 1_000_000;
const NANOS_PER_S: u128 = 1_000_000_000;
const NANOS_PER_M: u128 = 60 * NANOS_PER_S;
const NANOS_PER_H: u128 = 60 * NANOS_PER_M;

/// Fraction digits beyond this many are ignored: they are below a nanosecond for every unit,
/// and ignoring them keeps the arithmetic inside `u128`.
const FRACTION_DIGITS_MAX: u32 = 18;

/// Parses a Go-style duration string. Surrounding whitespace is ignored.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let text = text.trim();
    if text.is_empty() {
        return Err(DurationError::Empty);
    }
    if text.starts_with(['-', '+']) {
        return Err(DurationError::Signed);
    }
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (nanos, after) = parse_term(rest)?;
        total = total.checked_add(nanos).ok_or(DurationError::Overflow)?;
        rest = after;
    }
    let nanos = u64::try_from(total).map_err(|_| DurationError::Overflow)?;
    Ok(Duration::from_nanos(nanos))
}

/// Parses one `<decimal><unit>` term at the start of `text`; returns its nanoseconds and the
/// rest of the string.
fn parse_term(text: &str) -> Result<(u128, &str), DurationError> {
    let (whole, rest) = split_digits(text);
    let (fraction, rest) = match rest.strip_prefix('.') {
        Some(after_dot) => split_digits(after_dot),
        None => ("", rest),
    };
    if whole.is_empty() && fraction.is_empty() {
        return Err(DurationError::ExpectedNumber);
    }
    let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
    let (unit, rest) = rest.split_at(unit_len);
    let scale = unit_nanos(unit)?;
    let mut nanos: u128 = 0;
    for digit in whole.bytes() {
        nanos = nanos
            .checked_mul(10)
            .and_then(|n| n.checked_add(u128::from(digit - b'0')))
            .ok_or(DurationError::Overflow)?;
        // Anything above u64::MAX nanoseconds in total is refused later; stop early so the
        // multiplication by `scale` below cannot overflow u128.
        if nanos > u128::from(u64::MAX) {
            return Err(DurationError::Overflow);
        }
    }
    nanos *= scale;
    let mut numerator: u128 = 0;
    let mut denominator: u128 = 1;
    for digit in fraction.bytes().take(FRACTION_DIGITS_MAX as usize) {
        numerator = numerator * 10 + u128::from(digit - b'0');
        denominator *= 10;
    }
    nanos += numerator * scale / denominator;
    Ok((nanos, rest))
}

/// Splits `text` after its leading ASCII digits.
fn split_digits(text: &str) -> (&str, &str) {
    let end = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    text.split_at(end)
}

/// Nanoseconds in one `unit`.
fn unit_nanos(unit: &str) -> Result<u128, DurationError> {
    match unit {
        "" => Err(DurationError::MissingUnit),
        "ns" => Ok(1),
        "us" | "\u{b5}s" | "\u{3bc}s" => Ok(NANOS_PER_US),
        "ms" => Ok(NANOS_PER_MS),
        "s" => Ok(NANOS_PER_S),
        "m" => Ok(NANOS_PER_M),
        "h" => Ok(NANOS_PER_H),
        _ => Err(DurationError::UnknownUnit),
    }
}

/// Formats a duration with the largest unit that divides it exactly: `90s` → `"90s"`,
/// `1.5s` → `"1500ms"`, `2h` → `"2h"`, zero → `"0s"`. Durations above `u64::MAX`
/// nanoseconds are clamped to it (they cannot come from [`parse_duration`]).
pub fn format_duration(duration: Duration) -> String {
    let nanos = duration.as_nanos().min(u128::from(u64::MAX));
    if nanos == 0 {
        return "0s".to_owned();
    }
    let units = [
        (NANOS_PER_H, "h"),
        (NANOS_PER_M, "m"),
        (NANOS_PER_S, "s"),
        (NANOS_PER_MS, "ms"),
        (NANOS_PER_US, "us"),
    ];
    for (scale, unit) in units {
        if nanos % scale == 0 {
            return format!("{}{unit}", nanos / scale);
        }
    }
    format!("{nanos}ns")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(text: &str) -> Duration {
        parse_duration(text).unwrap_or_else(|e| panic!("{text:?}: {e}"))
    }

    #[test]
    fn parses_every_unit() {
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        assert_eq!(ok("0ms"), Duration::ZERO);
        assert_eq!(ok("7ns"), Duration::from_nanos(7));
        assert_eq!(ok("250us"), Duration::from_micros(250));
        assert_eq!(ok("250µs"), Duration::from_micros(250));
        assert_eq!(ok("250μs"), Duration::from_micros(250));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("5m"), Duration::from_secs(300));
        assert_eq!(ok("1h"), Duration::from_secs(3600));
    }

    #[test]
    fn adds_terms_and_fractions() {
        assert_eq!(ok("1m30s"), Duration::from_secs(90));
        assert_eq!(ok("1h2m3s4ms5us6ns"), Duration::new(3723, 4_005_006));
        assert_eq!(ok("1.5s"), Duration::from_millis(1500));
        assert_eq!(ok(".5s"), Duration::from_millis(500));
        assert_eq!(ok("1.s"), Duration::from_secs(1));
        assert_eq!(ok("0.25h"), Duration::from_secs(900));
        assert_eq!(ok("1.0000000001s"), Duration::from_secs(1));
        assert_eq!(ok("1.23456789012345678901234s"), Duration::from_nanos(1_234_567_890));
        assert_eq!(ok("  30s \n"), Duration::from_secs(30));
    }

    #[test]
    fn refuses_malformed_strings() {
        let cases = [
            ("", DurationError::Empty),
            ("   ", DurationError::Empty),
            ("-1s", DurationError::Signed),
            ("+1s", DurationError::Signed),
            ("30", DurationError::MissingUnit),
            ("1m30", DurationError::MissingUnit),
            ("s", DurationError::ExpectedNumber),
            (".s", DurationError::ExpectedNumber),
            ("1.5.5s", DurationError::MissingUnit),
            ("30 s", DurationError::UnknownUnit),
            ("30sec", DurationError::UnknownUnit),
            ("1d", DurationError::UnknownUnit),
            ("1S", DurationError::UnknownUnit),
            ("99999999999999999999999h", DurationError::Overflow),
            ("18446744073709551616ns", DurationError::Overflow),
            ("5124096h", DurationError::Overflow),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Err(expected), "{text:?}");
        }
    }

    #[test]
    fn largest_value_parses() {
        assert_eq!(ok("18446744073709551615ns"), Duration::from_nanos(u64::MAX));
    }

    #[test]
    fn error_message_shows_the_accepted_form() {
        let message = parse_duration("30").unwrap_err().to_string();
        assert!(message.starts_with("missing unit"), "{message}");
        assert!(message.contains("\"30s\""), "{message}");
    }

    #[test]
    fn formats_with_the_largest_exact_unit() {
        assert_eq!(format_duration(Duration::ZERO), "0s");
        assert_eq!(format_duration(Duration::from_secs(7200)), "2h");
        assert_eq!(format_duration(Duration::from_secs(300)), "5m");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format_duration(Duration::from_micros(250)), "250us");
        assert_eq!(format_duration(Duration::from_nanos(1_000_000_001)), "1000000001ns");
    }

    #[test]
    fn format_then_parse_is_the_identity() {
        let mut nanos: u64 = 1;
        while nanos < u64::MAX / 7 {
            for candidate in [nanos, nanos * 3, nanos * 7, nanos + 1] {
                let duration = Duration::from_nanos(candidate);
                assert_eq!(parse_duration(&format_duration(duration)), Ok(duration));
            }
            nanos *= 10;
        }
        let max = Duration::from_nanos(u64::MAX);
        assert_eq!(parse_duration(&format_duration(max)), Ok(max));
    }
}
