//! Query parameters as the handlers need them: first occurrence wins, form-decoded, with the
//! spec's error answer when an escape does not decode.

use super::error;
use crate::http::Response;
use crate::wire::query::Query;

pub struct Params<'a>(Query<'a>);

impl<'a> Params<'a> {
    pub fn new(raw: &'a str) -> Params<'a> {
        Params(Query::new(raw.as_bytes()))
    }

    /// The first value of `key` as bytes; an undecodable escape answers `400 invalid <key>: ...`.
    pub fn bytes(&self, key: &str) -> Result<Option<Vec<u8>>, Response> {
        match self.0.first(key) {
            None => Ok(None),
            Some(Ok(v)) => Ok(Some(v.into_owned())),
            Some(Err(e)) => Err(error(400, &format!("invalid {key}: {e}"))),
        }
    }

    /// The first value of `key` as text (invalid UTF-8 is replaced, which no numeric or keyword
    /// parameter accepts anyway).
    pub fn str(&self, key: &str) -> Result<Option<String>, Response> {
        Ok(self
            .bytes(key)?
            .map(|b| String::from_utf8_lossy(&b).into_owned()))
    }

    /// Like [`Params::str`], but an empty value (`?limit=`) counts as absent, as the original
    /// broker treats it: a client that builds its query from empty variables gets the default.
    pub fn given(&self, key: &str) -> Result<Option<String>, Response> {
        Ok(self.str(key)?.filter(|v| !v.is_empty()))
    }

    pub fn count(&self, key: &str) -> usize {
        self.0.count(key)
    }
}
