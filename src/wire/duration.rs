//! Go `time.Duration` strings, as the Go SDK sends them in `wait` (`10s`, `500ms`, `1.5s`,
//! `1m0s`, `100µs`) and as the broker answers in `X-Narad-Wait-Clamped`. A transcription of Go's
//! `time.ParseDuration` and `Duration.String`, including the error texts.

use std::fmt;

const NS: u64 = 1;
const US: u64 = 1_000;
const MS: u64 = 1_000_000;
const S: u64 = 1_000_000_000;
const M: u64 = 60 * S;
const H: u64 = 60 * M;
const TOP: u64 = 1 << 63;

/// A signed count of nanoseconds, like Go's `time.Duration`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct GoDuration {
    pub nanos: i64,
}

impl GoDuration {
    /// Parses a Go duration string (bytes after URL decoding, not necessarily UTF-8). The error
    /// is Go's text, e.g. `time: invalid duration "x"`; the caller prefixes `invalid wait: `.
    pub fn parse(s: &[u8]) -> Result<GoDuration, String> {
        let orig = s;
        let invalid = || format!("time: invalid duration {}", quote(orig));
        let mut s = s;
        let mut neg = false;
        if let Some(&c) = s.first() {
            if c == b'-' || c == b'+' {
                neg = c == b'-';
                s = &s[1..];
            }
        }
        if s == b"0" {
            return Ok(GoDuration { nanos: 0 });
        }
        if s.is_empty() {
            return Err(invalid());
        }
        let mut d: u64 = 0;
        // Each iteration consumes at least one byte, so the loop is bounded by the input length.
        while !s.is_empty() {
            if !(s[0] == b'.' || s[0].is_ascii_digit()) {
                return Err(invalid());
            }
            let before = s.len();
            let (v, rest) = leading_int(s).ok_or_else(invalid)?;
            let mut v = v;
            s = rest;
            let pre = before != s.len();
            let mut post = false;
            let (mut f, mut scale) = (0u64, 1f64);
            if s.first() == Some(&b'.') {
                s = &s[1..];
                let before = s.len();
                let (ff, sc, rest) = leading_fraction(s);
                f = ff;
                scale = sc;
                s = rest;
                post = before != s.len();
            }
            if !pre && !post {
                return Err(invalid());
            }
            let i = s
                .iter()
                .position(|&c| c == b'.' || c.is_ascii_digit())
                .unwrap_or(s.len());
            if i == 0 {
                return Err(format!("time: missing unit in duration {}", quote(orig)));
            }
            let u = &s[..i];
            s = &s[i..];
            let unit = match u {
                b"ns" => NS,
                // "µs" (U+00B5) and "μs" (U+03BC).
                b"us" | b"\xc2\xb5s" | b"\xce\xbcs" => US,
                b"ms" => MS,
                b"s" => S,
                b"m" => M,
                b"h" => H,
                _ => {
                    return Err(format!(
                        "time: unknown unit {} in duration {}",
                        quote(u),
                        quote(orig)
                    ))
                }
            };
            if v > TOP / unit {
                return Err(invalid());
            }
            v *= unit;
            if f > 0 {
                // As Go: float64 keeps fractions of hours nanosecond-accurate.
                v += (f as f64 * (unit as f64 / scale)) as u64;
                if v > TOP {
                    return Err(invalid());
                }
            }
            d += v;
            if d > TOP {
                return Err(invalid());
            }
        }
        if neg {
            return Ok(GoDuration {
                nanos: (d as i64).wrapping_neg(),
            });
        }
        if d > TOP - 1 {
            return Err(invalid());
        }
        Ok(GoDuration { nanos: d as i64 })
    }

    /// The std duration, negative clamped to zero (a negative `wait` means no wait).
    pub fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_nanos(u64::try_from(self.nanos).unwrap_or(0))
    }

    /// From a std duration, saturating at Go's maximum.
    pub fn from_std(d: std::time::Duration) -> GoDuration {
        GoDuration {
            nanos: i64::try_from(d.as_nanos()).unwrap_or(i64::MAX),
        }
    }
}

/// Go's `leadingInt`: `None` on overflow past 2^63.
fn leading_int(s: &[u8]) -> Option<(u64, &[u8])> {
    let mut x: u64 = 0;
    let mut i = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        if x > TOP / 10 {
            return None;
        }
        x = x * 10 + u64::from(s[i] - b'0');
        if x > TOP {
            return None;
        }
        i += 1;
    }
    Some((x, &s[i..]))
}

/// Go's `leadingFraction`: digits past the precision of a u64 are consumed and ignored.
fn leading_fraction(s: &[u8]) -> (u64, f64, &[u8]) {
    let mut x: u64 = 0;
    let mut scale = 1f64;
    let mut overflow = false;
    let mut i = 0;
    while i < s.len() && s[i].is_ascii_digit() {
        let c = s[i];
        i += 1;
        if overflow {
            continue;
        }
        if x > (TOP - 1) / 10 {
            overflow = true;
            continue;
        }
        let y = x * 10 + u64::from(c - b'0');
        if y > TOP {
            overflow = true;
            continue;
        }
        x = y;
        scale *= 10.0;
    }
    (x, scale, &s[i..])
}

/// The `quote` of Go's time package: `"` and `\` escaped, control and non-ASCII bytes as `\xHH`.
fn quote(s: &[u8]) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for &c in s {
        if !(b' '..0x80).contains(&c) {
            out.push_str(&format!("\\x{c:02x}"));
        } else {
            if c == b'"' || c == b'\\' {
                out.push('\\');
            }
            out.push(c as char);
        }
    }
    out.push('"');
    out
}

/// Go's `fmtFrac`: writes the fraction of v/10^prec before `w`, trailing zeros omitted.
fn fmt_frac(buf: &mut [u8; 32], mut w: usize, mut v: u64, prec: usize) -> (usize, u64) {
    let mut print = false;
    for _ in 0..prec {
        let digit = v % 10;
        print = print || digit != 0;
        if print {
            w -= 1;
            buf[w] = digit as u8 + b'0';
        }
        v /= 10;
    }
    if print {
        w -= 1;
        buf[w] = b'.';
    }
    (w, v)
}

/// Go's `fmtInt`.
fn fmt_int(buf: &mut [u8; 32], mut w: usize, mut v: u64) -> usize {
    if v == 0 {
        w -= 1;
        buf[w] = b'0';
    } else {
        while v > 0 {
            w -= 1;
            buf[w] = (v % 10) as u8 + b'0';
            v /= 10;
        }
    }
    w
}

impl fmt::Display for GoDuration {
    /// Go's `Duration.String()`: `0s`, `1.5µs`, `500ms`, `10s`, `1m0s`, `2h0m0s`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut buf = [0u8; 32];
        let mut w = buf.len();
        let neg = self.nanos < 0;
        let mut u = self.nanos.unsigned_abs();
        if u < S {
            let prec;
            w -= 1;
            buf[w] = b's';
            w -= 1;
            if u == 0 {
                return f.write_str("0s");
            } else if u < US {
                prec = 0;
                buf[w] = b'n';
            } else if u < MS {
                prec = 3;
                // 'µ' is U+00B5, two bytes.
                w -= 1;
                buf[w..w + 2].copy_from_slice("µ".as_bytes());
            } else {
                prec = 6;
                buf[w] = b'm';
            }
            let (nw, nu) = fmt_frac(&mut buf, w, u, prec);
            w = fmt_int(&mut buf, nw, nu);
        } else {
            w -= 1;
            buf[w] = b's';
            let (nw, nu) = fmt_frac(&mut buf, w, u, 9);
            u = nu;
            w = fmt_int(&mut buf, nw, u % 60);
            u /= 60;
            if u > 0 {
                w -= 1;
                buf[w] = b'm';
                w = fmt_int(&mut buf, w, u % 60);
                u /= 60;
                if u > 0 {
                    w -= 1;
                    buf[w] = b'h';
                    w = fmt_int(&mut buf, w, u);
                }
            }
        }
        if neg {
            w -= 1;
            buf[w] = b'-';
        }
        f.write_str(std::str::from_utf8(&buf[w..]).map_err(|_| fmt::Error)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<i64, String> {
        GoDuration::parse(s.as_bytes()).map(|d| d.nanos)
    }

    #[test]
    fn parses_what_go_parses() {
        // Proves the parser agrees with Go's ParseDuration test table, including the forms the Go
        // SDK sends (`1m0s`, `1.5s`, `100µs`) and the precision and range edges.
        let s = S as i64;
        let ms = MS as i64;
        let us = US as i64;
        let m = M as i64;
        let h = H as i64;
        let cases: &[(&str, i64)] = &[
            ("0", 0),
            ("5s", 5 * s),
            ("30s", 30 * s),
            ("1478s", 1478 * s),
            ("-5s", -5 * s),
            ("+5s", 5 * s),
            ("-0", 0),
            ("+0", 0),
            ("5.0s", 5 * s),
            ("5.6s", 5 * s + 600 * ms),
            ("5.s", 5 * s),
            (".5s", 500 * ms),
            ("1.0s", s),
            ("1.00s", s),
            ("1.004s", s + 4 * ms),
            ("1.0040s", s + 4 * ms),
            ("100.00100s", 100 * s + ms),
            ("10ns", 10),
            ("11us", 11 * us),
            ("12µs", 12 * us),
            ("12μs", 12 * us),
            ("13ms", 13 * ms),
            ("14s", 14 * s),
            ("15m", 15 * m),
            ("16h", 16 * h),
            ("2h", 2 * h),
            ("3h30m", 3 * h + 30 * m),
            ("10.5s4m", 4 * m + 10 * s + 500 * ms),
            ("-2m3.4s", -(2 * m + 3 * s + 400 * ms)),
            ("1h2m3s4ms5us6ns", h + 2 * m + 3 * s + 4 * ms + 5 * us + 6),
            ("39h9m14.425s", 39 * h + 9 * m + 14 * s + 425 * ms),
            ("52763797000ns", 52763797000),
            ("0.3333333333333333333h", 20 * m),
            ("9007199254740993ns", (1 << 53) + 1),
            ("9223372036854775807ns", i64::MAX),
            ("9223372036854775.807us", i64::MAX),
            ("9223372036s854ms775us807ns", i64::MAX),
            ("-9223372036854775808ns", i64::MIN),
            ("-9223372036854775.808us", i64::MIN),
            ("0.100000000000000000000h", 6 * m),
            ("0.830103483285477580700h", 49 * m + 48 * s + 372539827),
            ("1m0s", m),
            ("1m30s", m + 30 * s),
            ("1.5s", s + 500 * ms),
            ("500ms", 500 * ms),
            ("100µs", 100 * us),
            ("100us", 100 * us),
        ];
        for &(text, want) in cases {
            assert_eq!(p(text), Ok(want), "{text}");
        }
    }

    #[test]
    fn refuses_with_go_error_texts() {
        // Proves invalid inputs get Go's exact error messages, including its quoting of
        // non-ASCII and invalid UTF-8 bytes.
        let cases: &[(&[u8], &str)] = &[
            (b"", r#"time: invalid duration """#),
            (b"3", r#"time: missing unit in duration "3""#),
            (b"-", r#"time: invalid duration "-""#),
            (b"s", r#"time: invalid duration "s""#),
            (b".", r#"time: invalid duration ".""#),
            (b"-.", r#"time: invalid duration "-.""#),
            (b".s", r#"time: invalid duration ".s""#),
            (b"+.s", r#"time: invalid duration "+.s""#),
            (b"1d", r#"time: unknown unit "d" in duration "1d""#),
            (b"\x85\x85", r#"time: invalid duration "\x85\x85""#),
            (b"\xffff", r#"time: invalid duration "\xffff""#),
            (
                b"hello \xffff world",
                r#"time: invalid duration "hello \xffff world""#,
            ),
            (
                "\u{FFFD}".as_bytes(),
                r#"time: invalid duration "\xef\xbf\xbd""#,
            ),
            (
                b"9223372036854775810ns",
                r#"time: invalid duration "9223372036854775810ns""#,
            ),
            (
                b"9223372036854775808ns",
                r#"time: invalid duration "9223372036854775808ns""#,
            ),
            (
                b"9223372036854775.808us",
                r#"time: invalid duration "9223372036854775.808us""#,
            ),
            (b"3000000h", r#"time: invalid duration "3000000h""#),
            (b"x", r#"time: invalid duration "x""#),
            (b"10", r#"time: missing unit in duration "10""#),
            (b"1 s", r#"time: unknown unit " s" in duration "1 s""#),
            (b"1\"s", r#"time: unknown unit "\"s" in duration "1\"s""#),
            (b"10S", r#"time: unknown unit "S" in duration "10S""#),
        ];
        for &(text, want) in cases {
            assert_eq!(GoDuration::parse(text), Err(want.to_string()), "{text:?}");
        }
    }

    #[test]
    fn formats_like_go_duration_string() {
        // Proves Display matches Go's Duration.String() table, so X-Narad-Wait-Clamped reads
        // `10s`, `1m0s` and so on.
        let cases: &[(i64, &str)] = &[
            (0, "0s"),
            (1, "1ns"),
            (1100, "1.1µs"),
            (2_200_000, "2.2ms"),
            (3_300_000_000, "3.3s"),
            (4 * M as i64 + 5 * S as i64, "4m5s"),
            (4 * M as i64 + 5001 * MS as i64, "4m5.001s"),
            (5 * H as i64 + 6 * M as i64 + 7001 * MS as i64, "5h6m7.001s"),
            (8 * M as i64 + 1, "8m0.000000001s"),
            (i64::MAX, "2562047h47m16.854775807s"),
            (i64::MIN, "-2562047h47m16.854775808s"),
            (10 * S as i64, "10s"),
            (30 * S as i64, "30s"),
            (M as i64, "1m0s"),
            (2 * H as i64, "2h0m0s"),
            (500 * MS as i64, "500ms"),
            (100 * US as i64, "100µs"),
            (-1500 * MS as i64, "-1.5s"),
        ];
        for &(nanos, want) in cases {
            assert_eq!(GoDuration { nanos }.to_string(), want);
            // And the text parses back to the same value.
            assert_eq!(GoDuration::parse(want.as_bytes()), Ok(GoDuration { nanos }));
        }
    }

    #[test]
    fn converts_to_and_from_std() {
        // Proves negative waits clamp to zero and huge std durations saturate.
        assert_eq!(GoDuration { nanos: -5 }.to_std(), std::time::Duration::ZERO);
        assert_eq!(
            GoDuration {
                nanos: 1_500_000_000
            }
            .to_std(),
            std::time::Duration::from_millis(1500)
        );
        assert_eq!(
            GoDuration::from_std(std::time::Duration::from_secs(10)).to_string(),
            "10s"
        );
        assert_eq!(
            GoDuration::from_std(std::time::Duration::MAX).nanos,
            i64::MAX
        );
    }
}
