//! TLS on the main listener (issue \[11\]): the `[server.tls]` files read into a rustls
//! [`ServerConfig`], and the checks a certificate and key must pass before a generation takes
//! them.
//!
//! [`load`] reads the PEM files (rustls' pki-types PEM reader: a chain of `CERTIFICATE`
//! blocks, leaf first, and one private key, PKCS#8, PKCS#1 or SEC1), refuses a pair that would
//! fail every client (an empty chain, a key ring cannot use, a key whose public half is not the
//! leaf's, a certificate outside its validity period at the moment of loading) and builds the
//! configuration: TLS 1.3 and 1.2 with ring's cipher suites, no client certificates, ALPN
//! `http/1.1` only (a client that offers ALPN without it fails the handshake with
//! `no_application_protocol`, RFC 7301 3.2; one that offers none is served HTTP/1.1).
//!
//! It runs when a generation is built, so at start (an error stops the router) and on every
//! reload (an error refuses the reload and the running generation keeps its certificate): a
//! reload re-reads the files even when the configuration did not change, which is how a
//! renewed certificate is put in place. A connection keeps the configuration it was accepted
//! under (its `ServerConnection` holds an `Arc` of it), so a reload changes the certificate of
//! new connections only. The handshake and the record layer run in the shards
//! (`server::shard::connection`).
//!
//! The validity period is read from the leaf's DER with a minimal walk of RFC 5280's
//! `TBSCertificate` (tag, length and value of its first five fields; [`validity`]): rustls does
//! not check its own certificate's dates, and a whole X.509 parser is not needed for two
//! fields. Every certificate of the chain is checked, so an expired intermediate is named too.

use std::path::Path;
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use rustls::ServerConfig;

/// The one application protocol the main listener speaks.
pub const ALPN_HTTP11: &[u8] = b"http/1.1";

/// Reads `cert` and `key` (PEM) and builds the main listener's TLS configuration, checked at
/// `now` (seconds since the Unix epoch); the error names the file and what is wrong with it.
pub fn load(cert: &Path, key: &Path, now: u64) -> Result<Arc<ServerConfig>, String> {
    let cert_name = format!("server.tls.cert {:?}", cert.display().to_string());
    let key_name = format!("server.tls.key {:?}", key.display().to_string());
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| format!("{cert_name}: {}", pem_error(&e)))?;
    if chain.is_empty() {
        return Err(format!("{cert_name}: no CERTIFICATE block in the file"));
    }
    for (index, der) in chain.iter().enumerate() {
        let which =
            if index == 0 { "the certificate".to_owned() } else { format!("chain #{index}") };
        check_validity(der, now).map_err(|e| format!("{cert_name}: {which} {e}"))?;
    }
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{key_name}: {}", pem_error(&e)))?;
    // Deprecated in rustls 0.23.48 for lacking post-quantum key exchange, which only
    // aws-lc-rs offers: a C build with cmake that this project does not take on (Cargo.toml).
    #[allow(deprecated)]
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let signing_key = provider
        .key_provider
        .load_private_key(key_der)
        .map_err(|e| format!("{key_name}: not a usable private key ({e})"))?;
    let certified = CertifiedKey::new(chain, signing_key);
    certified.keys_match().map_err(|e| match e {
        rustls::Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch) => {
            format!("{key_name} does not belong to the certificate in {cert_name}")
        }
        other => format!("{key_name} cannot be checked against {cert_name} ({other})"),
    })?;
    build(provider, certified).map_err(|e| format!("{cert_name}: {e}"))
}

/// The server configuration around a checked certificate and key.
fn build(
    provider: Arc<CryptoProvider>,
    certified: CertifiedKey,
) -> Result<Arc<ServerConfig>, rustls::Error> {
    let resolver = Arc::new(rustls::sign::SingleCertAndKey::from(certified));
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_cert_resolver(resolver);
    config.alpn_protocols = vec![ALPN_HTTP11.to_vec()];
    Ok(Arc::new(config))
}

fn pem_error(error: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match error {
        Error::Io(e) => format!("cannot read it ({e})"),
        Error::NoItemsFound => "no private key block in the file (PRIVATE KEY, RSA PRIVATE KEY \
                                or EC PRIVATE KEY)"
            .to_owned(),
        other => format!("not valid PEM ({other:?})"),
    }
}

/// Refuses a certificate that is not valid at `now` (seconds since the epoch).
fn check_validity(der: &[u8], now: u64) -> Result<(), String> {
    let (not_before, not_after) =
        validity(der).ok_or("is not a DER X.509 certificate (no validity period found)")?;
    if now < not_before {
        return Err(format!("is not valid before {}", format_utc(not_before)));
    }
    if now > not_after {
        return Err(format!("expired at {}", format_utc(not_after)));
    }
    Ok(())
}

/// The validity period of an X.509 certificate in DER, as seconds since the Unix epoch
/// (`notBefore`, `notAfter`); `None` when the bytes do not have RFC 5280's shape up to there.
pub fn validity(der: &[u8]) -> Option<(u64, u64)> {
    let (tag, certificate, _) = tlv(der)?;
    let (tbs_tag, tbs, _) = tlv(certificate)?;
    if tag != 0x30 || tbs_tag != 0x30 {
        return None;
    }
    let mut rest = tbs;
    let (first, _, after) = tlv(rest)?;
    if first == 0xa0 {
        rest = after; // version [0] EXPLICIT, absent in v1 certificates
    }
    for expected in [0x02, 0x30, 0x30] {
        // serialNumber, signature, issuer
        let (tag, _, after) = tlv(rest)?;
        if tag != expected {
            return None;
        }
        rest = after;
    }
    let (tag, validity, _) = tlv(rest)?;
    if tag != 0x30 {
        return None;
    }
    let (before_tag, before, after) = tlv(validity)?;
    let (after_tag, not_after, _) = tlv(after)?;
    Some((asn1_time(before_tag, before)?, asn1_time(after_tag, not_after)?))
}

/// One DER tag-length-value: the tag, the value and what follows it. Low tag numbers only (an
/// X.509 certificate uses no others) and definite lengths of up to four bytes.
fn tlv(bytes: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = bytes.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, mut rest) = rest.split_first()?;
    let len = match first {
        0..=0x7f => usize::from(first),
        0x81..=0x84 => {
            let count = usize::from(first & 0x7f);
            if rest.len() < count {
                return None;
            }
            let (digits, after) = rest.split_at(count);
            rest = after;
            digits.iter().fold(0usize, |len, &d| (len << 8) | usize::from(d))
        }
        _ => return None,
    };
    if rest.len() < len {
        return None;
    }
    let (value, after) = rest.split_at(len);
    Some((tag, value, after))
}

/// An RFC 5280 `Time`: UTCTime `YYMMDDHHMMSSZ` (years 1950 to 2049) or GeneralizedTime
/// `YYYYMMDDHHMMSSZ`, as seconds since the Unix epoch (`None` before 1970 or malformed).
fn asn1_time(tag: u8, value: &[u8]) -> Option<u64> {
    let (year, rest) = match (tag, value.len()) {
        (0x17, 13) => {
            let yy = digits(&value[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &value[2..])
        }
        (0x18, 15) => (digits(&value[..4])?, &value[4..]),
        _ => return None,
    };
    if rest[10] != b'Z' {
        return None;
    }
    let field = |i: usize| digits(&rest[i..i + 2]);
    let (month, day, hour, minute, second) =
        (field(0)?, field(2)?, field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    if second > 60 || year < 1970 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// ASCII decimal digits as a number.
fn digits(text: &[u8]) -> Option<u64> {
    text.iter().try_fold(0u64, |n, &c| c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0')))
}

/// Days from 1970-01-01 to a date of the proleptic Gregorian calendar, from 1970 on (Howard
/// Hinnant's `days_from_civil`, "chrono-Compatible Low-Level Date Algorithms").
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12; // March = 0
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC` (Hinnant's `civil_from_days`).
fn format_utc(seconds: u64) -> String {
    let (days, time) = (seconds / 86_400, seconds % 86_400);
    let z = days + 719_468;
    let era = z / 146_097;
    let day_of_era = z - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1_460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let month_index = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * month_index + 2) / 5 + 1;
    let month = if month_index < 10 { month_index + 3 } else { month_index - 9 };
    let year = year_of_era + era * 400 + u64::from(month <= 2);
    let (hour, minute, second) = (time / 3_600, time % 3_600 / 60, time % 60);
    format!("{year:04}-{month:02}-{day:02} {hour:02}:{minute:02}:{second:02} UTC")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_convert_both_ways() {
        for (date, seconds) in [
            ("1970-01-01 00:00:00 UTC", 0),
            ("2000-02-29 12:34:56 UTC", 951_827_696),
            ("2026-12-05 06:00:00 UTC", 1_796_450_400),
            ("2049-12-31 23:59:59 UTC", 2_524_607_999),
        ] {
            assert_eq!(format_utc(seconds), date);
            let y = date[..4].parse().unwrap();
            let m = date[5..7].parse().unwrap();
            let d = date[8..10].parse().unwrap();
            assert_eq!(days_from_civil(y, m, d) * 86_400 + seconds % 86_400, seconds, "{date}");
        }
    }

    #[test]
    fn times_of_both_kinds_parse_and_malformed_ones_do_not() {
        assert_eq!(asn1_time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(asn1_time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(asn1_time(0x18, b"20000229123456Z"), Some(951_827_696));
        for (tag, bad) in [
            (0x17, b"7001010000000".as_slice()),
            (0x17, b"700101000000"),
            (0x18, b"2000022912345Z"),
            (0x17, b"701301000000Z"),
            (0x17, b"7001010000a0Z"),
            (0x18, b"19690101000000Z"),
            (0x04, b"700101000000Z"),
        ] {
            assert_eq!(asn1_time(tag, bad), None, "{:?}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn truncated_or_strange_der_has_no_validity() {
        assert_eq!(validity(&[]), None);
        assert_eq!(validity(&[0x30, 0x85, 1, 2, 3, 4, 5]), None, "five length bytes");
        assert_eq!(validity(&[0x30, 0x82, 0xff]), None, "length cut");
        assert_eq!(validity(&[0x30, 0x03, 0x30, 0x01, 0x02]), None, "no fields");
        assert_eq!(validity(&[0x1f, 0x01, 0x00]), None, "high tag number");
        // A certificate-shaped prefix cut anywhere has no validity.
        let shaped = [
            0x30, 0x2b, 0x30, 0x29, 0x02, 0x01, 0x01, 0x30, 0x00, 0x30, 0x00, 0x30, 0x1e, 0x17,
            0x0d, b'7', b'0', b'0', b'1', b'0', b'1', b'0', b'0', b'0', b'0', b'0', b'0', b'Z',
            0x17, 0x0d, b'4', b'9', b'1', b'2', b'3', b'1', b'2', b'3', b'5', b'9', b'5', b'9',
            b'Z', 0x30, 0x00,
        ];
        assert_eq!(validity(&shaped), Some((0, 2_524_607_999)));
        for cut in 0..shaped.len() - 2 {
            let mut bytes = shaped[..cut].to_vec();
            if bytes.len() >= 4 {
                bytes[1] = (cut - 2) as u8;
                bytes[3] = (cut - 4) as u8;
            }
            assert_eq!(validity(&bytes), None, "cut at {cut}");
        }
    }
}
