//! Query strings as Go's `url.ParseQuery` reads them: pairs split on `&`, key and value split at
//! the first `=`, form decoding (`+` is a space, `%XX` a byte, any byte sequence allowed after
//! decoding). Pairs whose raw text contains `;` or whose key does not decode are skipped, as Go
//! (≥ 1.17) skips them. A value that does not decode is reported to the caller, who answers
//! `400 invalid <name>: <detail>`. Nothing here allocates unless a value contains an escape.

use std::borrow::Cow;
use std::fmt;

use super::go_quote;

/// A `%` not followed by two hex digits. Displays as Go's `url.EscapeError`:
/// `invalid URL escape "%zz"`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EscapeError(pub Vec<u8>);

impl fmt::Display for EscapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid URL escape {}", go_quote(&self.0))
    }
}

impl std::error::Error for EscapeError {}

/// A query parameter that must appear at most once appeared twice, or its value did not decode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueryError {
    Duplicate,
    Escape(EscapeError),
}

fn hex(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Form-decodes one key or value: `+` → space, `%XX` → the byte 0xXX.
pub fn form_decode(raw: &[u8]) -> Result<Cow<'_, [u8]>, EscapeError> {
    unescape(raw, true)
}

/// Decodes one path segment as Go's `url.PathUnescape`: `%XX` → the byte 0xXX, `+` stays `+`.
pub fn path_decode(raw: &[u8]) -> Result<Cow<'_, [u8]>, EscapeError> {
    unescape(raw, false)
}

fn unescape(raw: &[u8], plus_is_space: bool) -> Result<Cow<'_, [u8]>, EscapeError> {
    if !raw
        .iter()
        .any(|&c| c == b'%' || (plus_is_space && c == b'+'))
    {
        return Ok(Cow::Borrowed(raw));
    }
    let mut out = Vec::with_capacity(raw.len());
    let mut i = 0;
    while i < raw.len() {
        match raw[i] {
            b'%' => {
                let byte = match (
                    raw.get(i + 1).and_then(|&c| hex(c)),
                    raw.get(i + 2).and_then(|&c| hex(c)),
                ) {
                    (Some(h), Some(l)) => (h << 4) | l,
                    _ => return Err(EscapeError(raw[i..raw.len().min(i + 3)].to_vec())),
                };
                out.push(byte);
                i += 3;
            }
            b'+' if plus_is_space => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    Ok(Cow::Owned(out))
}

/// A decoded key and the decoding result of its value.
pub type Pair<'a> = (Cow<'a, [u8]>, Result<Cow<'a, [u8]>, EscapeError>);

/// A raw query string (the part after `?`, without any `#fragment`).
#[derive(Clone, Copy, Debug)]
pub struct Query<'a> {
    raw: &'a [u8],
}

impl<'a> Query<'a> {
    pub fn new(raw: &'a [u8]) -> Query<'a> {
        Query { raw }
    }

    /// Raw `(key, value)` segments in order, before decoding; `;`-carrying and empty segments
    /// skipped. A segment without `=` has an empty value.
    pub fn raw_pairs(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        self.raw
            .split(|&c| c == b'&')
            .filter(|seg| !seg.is_empty() && !seg.contains(&b';'))
            .map(|seg| match seg.iter().position(|&c| c == b'=') {
                Some(eq) => (&seg[..eq], &seg[eq + 1..]),
                None => (seg, &seg[seg.len()..]),
            })
    }

    /// Decoded pairs in order. Pairs whose key does not decode are skipped (as Go); the value's
    /// decoding result is left to the caller.
    pub fn pairs(&self) -> impl Iterator<Item = Pair<'a>> + 'a {
        self.raw_pairs()
            .filter_map(|(k, v)| Some((form_decode(k).ok()?, form_decode(v))))
    }

    /// Values of `key`, in order.
    pub fn values<'k>(
        &self,
        key: &'k str,
    ) -> impl Iterator<Item = Result<Cow<'a, [u8]>, EscapeError>> + 'k
    where
        'a: 'k,
    {
        self.pairs()
            .filter(move |(k, _)| k.as_ref() == key.as_bytes())
            .map(|(_, v)| v)
    }

    /// The first value of `key` ("first occurrence wins").
    pub fn first(&self, key: &str) -> Option<Result<Cow<'a, [u8]>, EscapeError>> {
        self.values(key).next()
    }

    /// How many times `key` appears.
    pub fn count(&self, key: &str) -> usize {
        self.values(key).count()
    }

    /// Whether `key` appears at all (even with an empty value).
    pub fn has(&self, key: &str) -> bool {
        self.values(key).next().is_some()
    }

    /// The value of a parameter that may appear at most once (`key`, `partition` on produce).
    pub fn unique(&self, key: &str) -> Result<Option<Cow<'a, [u8]>>, QueryError> {
        let mut it = self.values(key);
        let Some(first) = it.next() else {
            return Ok(None);
        };
        if it.next().is_some() {
            return Err(QueryError::Duplicate);
        }
        first.map(Some).map_err(QueryError::Escape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dec(s: &str) -> Vec<u8> {
        form_decode(s.as_bytes()).unwrap().into_owned()
    }

    #[test]
    fn decodes_what_the_go_sdk_sends() {
        // Proves the CLIENTS.md examples: `+` is a space, escapes are bytes (not necessarily
        // UTF-8), `%3A` is ':' and `100%C2%B5s` is `100µs`.
        assert_eq!(
            dec("0%3A0%3A1836419432839090974"),
            b"0:0:1836419432839090974"
        );
        assert_eq!(
            dec("customer+42%2F%C3%A9%26x%3D1"),
            "customer 42/é&x=1".as_bytes()
        );
        assert_eq!(dec("%00%9F%FFk"), vec![0x00, 0x9F, 0xFF, b'k']);
        assert_eq!(dec("100%C2%B5s"), "100µs".as_bytes());
        assert_eq!(dec("%e9%E9"), vec![0xE9, 0xE9]);
        assert!(matches!(form_decode(b"plain"), Ok(Cow::Borrowed(b"plain"))));
    }

    #[test]
    fn path_segments_keep_plus_and_refuse_bad_escapes() {
        // Proves the path decoder is Go's PathUnescape: `+` stays `+` (and alone borrows),
        // escapes are bytes, and an escape without two hex digits is refused like in a query.
        assert!(matches!(path_decode(b"a+b"), Ok(Cow::Borrowed(b"a+b"))));
        assert_eq!(path_decode(b"a+%2Fb%FF").unwrap().as_ref(), b"a+/b\xff");
        for bad in ["a%ZZb", "a%4", "a%"] {
            assert!(path_decode(bad.as_bytes()).is_err(), "{bad}");
        }
    }

    #[test]
    fn bad_escapes_report_go_text() {
        // Proves an escape without two hex digits is an error displaying as Go's EscapeError.
        for (raw, want) in [
            ("%zz", r#"invalid URL escape "%zz""#),
            ("ab%4", r#"invalid URL escape "%4""#),
            ("ab%", r#"invalid URL escape "%""#),
            ("%4g1", r#"invalid URL escape "%4g""#),
            ("x%\u{e9}", r#"invalid URL escape "%é""#),
        ] {
            assert_eq!(
                form_decode(raw.as_bytes()).unwrap_err().to_string(),
                want,
                "{raw}"
            );
        }
        assert_eq!(
            form_decode(b"%\xff\xfe").unwrap_err().to_string(),
            r#"invalid URL escape "%\xff\xfe""#
        );
    }

    #[test]
    fn pairs_iterate_in_order_with_first_occurrence_and_duplicates() {
        // Proves order is kept, keys are decoded before matching, first occurrence wins,
        // duplicates are detected, and the SDK's sorted query shapes read correctly.
        let q = Query::new(b"extend=0&receipt_handle=0%3A0%3A1&rec%65ipt_handle=9%3A9%3A9&flag&=v");
        let pairs: Vec<(Vec<u8>, Vec<u8>)> = q
            .pairs()
            .map(|(k, v)| (k.into_owned(), v.unwrap().into_owned()))
            .collect();
        assert_eq!(
            pairs,
            vec![
                (b"extend".to_vec(), b"0".to_vec()),
                (b"receipt_handle".to_vec(), b"0:0:1".to_vec()),
                (b"receipt_handle".to_vec(), b"9:9:9".to_vec()),
                (b"flag".to_vec(), b"".to_vec()),
                (b"".to_vec(), b"v".to_vec()),
            ]
        );
        assert_eq!(
            q.first("receipt_handle").unwrap().unwrap().as_ref(),
            b"0:0:1"
        );
        assert_eq!(q.count("receipt_handle"), 2);
        assert_eq!(q.unique("receipt_handle"), Err(QueryError::Duplicate));
        assert_eq!(q.unique("extend"), Ok(Some(Cow::Borrowed(&b"0"[..]))));
        assert_eq!(q.unique("partition"), Ok(None));
        assert!(q.has("flag"));
        assert!(!q.has("fla"));
        let q = Query::new(b"max=10&wait=1m0s");
        assert_eq!(q.first("wait").unwrap().unwrap().as_ref(), b"1m0s");
    }

    #[test]
    fn go_skips_semicolon_pairs_and_undecodable_keys_but_reports_bad_values() {
        // Proves pairs with ';' or an undecodable key are skipped like Go's ParseQuery, while a
        // value with a bad escape surfaces as an error for `invalid <name>: <detail>`.
        let q = Query::new(b"a=1;b=2&%zz=3&receipt_handle=%GG&key=ok&&");
        assert!(!q.has("a"));
        assert_eq!(q.pairs().count(), 2);
        let err = q.first("receipt_handle").unwrap().unwrap_err();
        assert_eq!(
            format!("invalid receipt_handle: {err}"),
            r#"invalid receipt_handle: invalid URL escape "%GG""#
        );
        assert_eq!(
            q.unique("receipt_handle"),
            Err(QueryError::Escape(EscapeError(b"%GG".to_vec())))
        );
        assert_eq!(Query::new(b"").pairs().count(), 0);
    }
}
