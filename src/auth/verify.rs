//! The bcrypt helper threads: password hashing and verification never run on a shard thread
//! (a check costs 50-250 ms). [`VERIFY_THREADS`] threads of a [`narad_io::rt::pool::Pool`] run
//! them, urgent jobs first (hashing, and checks for usernames without recent failures, so a
//! password-guessing storm on some accounts does not delay everyone else's logins, API.md §2);
//! a full queue is refused at once (the caller answers `503`). Concurrent identical login
//! attempts share one check through its [`Slot`].

pub use narad_io::rt::pool::{Busy, Job, Pool, Slot, Ticket};

/// bcrypt checks running at once per node (API.md §2).
pub const VERIFY_THREADS: usize = 4;
/// bcrypt cost of new hashes: Go's `bcrypt.DefaultCost`, the original's "default cost".
pub const BCRYPT_COST: u32 = 10;

/// The node's bcrypt pool.
pub fn bcrypt_pool() -> Pool {
    Pool::with_threads(VERIFY_THREADS, "narad-bcrypt")
}

/// A bcrypt hash of `password` at [`BCRYPT_COST`] (blocking: call it on a helper thread).
pub fn hash_blocking(password: &[u8]) -> Result<String, String> {
    // The salt comes from the workspace's one random source (`bcrypt::hash` would read its own).
    let mut salt = [0u8; 16];
    narad_io::sys::fill_random(&mut salt);
    bcrypt::hash_with_salt(password, BCRYPT_COST, salt)
        .map(|h| h.format_for_version(bcrypt::Version::TwoB))
        .map_err(|e| e.to_string())
}

/// Checks `password` against a stored bcrypt hash (blocking: call it on a helper thread).
/// `Err` means the stored hash is unusable.
pub fn verify_blocking(password: &[u8], hash: &str) -> Result<bool, String> {
    bcrypt::verify(password, hash).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bcrypt_round_trip() {
        // Proves hashes verify their own password and refuse another, keep the `$2b$` form and
        // cost that `bcrypt::hash` wrote before the salt came from `narad_io::sys`, and are
        // salted afresh each time.
        let h = hash_blocking(b"s3cret").unwrap();
        assert!(h.starts_with(&format!("$2b${BCRYPT_COST:02}$")), "{h}");
        assert_eq!(h.len(), 60, "{h}");
        assert_ne!(hash_blocking(b"s3cret").unwrap(), h);
        assert!(verify_blocking(b"s3cret", &h).unwrap());
        assert!(!verify_blocking(b"s3cret!", &h).unwrap());
        assert!(verify_blocking(b"x", "not a hash").is_err());
    }
}
