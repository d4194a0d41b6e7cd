//! Sealed remote passwords (API.md §14.1, SEMANTICS.md §13): AES-256-GCM under a key derived
//! from the cluster secret with HKDF-SHA256, so that the metadata (replicated, snapshotted, on
//! every node's disk) never holds a password in the clear, and only a node that knows the
//! cluster secret can open one.
//!
//! Owns the key derivation, the key's public version (a digest of the key under another HKDF
//! label: it names the key without revealing it), sealing and opening (the remote's name is the
//! additional authenticated data, so a sealed password cannot be moved to another remote), and
//! the password's fingerprint (HMAC-SHA256 under the key: equal passwords compare equal, but the
//! fingerprint says nothing about the password without the key). Never logs or returns a
//! password.

use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf::{Salt, HKDF_SHA256};
use ring::hmac;

/// Shortest cluster secret a sealing key is derived from.
pub const SECRET_BYTES_MIN: usize = 16;

const SALT: &[u8] = b"narad-remote-credentials-v1";

/// The key that seals remote passwords, derived from one cluster secret.
pub struct RemoteKey {
    aead: LessSafeKey,
    mac: hmac::Key,
    version: String,
}

/// Why a password could not be opened.
#[derive(Debug, PartialEq, Eq)]
pub enum OpenError {
    /// Sealed under another key (another cluster secret).
    KeyUnknown,
    /// Damaged, or sealed for another remote.
    Unreadable,
}

struct Len(usize);

impl ring::hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

fn expand(prk: &ring::hkdf::Prk, label: &[u8], n: usize) -> Vec<u8> {
    let mut out = vec![0u8; n];
    prk.expand(&[label], Len(n))
        .and_then(|okm| okm.fill(&mut out))
        .expect("HKDF-SHA256 expands up to 255 blocks; these are at most one");
    out
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

impl RemoteKey {
    /// The key of `secret`; `None` when the secret is missing or shorter than
    /// [`SECRET_BYTES_MIN`].
    pub fn derive(secret: &[u8]) -> Option<RemoteKey> {
        if secret.len() < SECRET_BYTES_MIN {
            return None;
        }
        let prk = Salt::new(HKDF_SHA256, SALT).extract(secret);
        let k = expand(&prk, b"aes-256-gcm key", 32);
        let aead = LessSafeKey::new(UnboundKey::new(&AES_256_GCM, &k).expect("a 32-byte key"));
        let mac = hmac::Key::new(hmac::HMAC_SHA256, &expand(&prk, b"fingerprint key", 32));
        let version = hex(&expand(&prk, b"key version", 8));
        Some(RemoteKey { aead, mac, version })
    }

    /// 16 hex characters naming this key.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Seals `password` for remote `name`: hex of a random 12-byte nonce and the ciphertext
    /// with its tag.
    pub fn seal(&self, name: &str, password: &[u8]) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        narad_io::sys::fill_random(&mut nonce);
        let mut buf = password.to_vec();
        self.aead
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(name.as_bytes()),
                &mut buf,
            )
            .expect("AES-256-GCM seals any length below 64 GiB");
        let mut out = hex(&nonce);
        out.push_str(&hex(&buf));
        out
    }

    /// Opens a password sealed for remote `name` under key version `key_version`.
    pub fn open(&self, name: &str, key_version: &str, sealed: &str) -> Result<Vec<u8>, OpenError> {
        if key_version != self.version {
            return Err(OpenError::KeyUnknown);
        }
        let raw = unhex(sealed).ok_or(OpenError::Unreadable)?;
        if raw.len() < NONCE_LEN + AES_256_GCM.tag_len() {
            return Err(OpenError::Unreadable);
        }
        let (n, ct) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(n).map_err(|_| OpenError::Unreadable)?;
        let mut buf = ct.to_vec();
        let plain = self
            .aead
            .open_in_place(nonce, Aad::from(name.as_bytes()), &mut buf)
            .map_err(|_| OpenError::Unreadable)?;
        Ok(plain.to_vec())
    }

    /// 16 hex characters of HMAC-SHA256(password) under this key.
    pub fn fingerprint(&self, password: &[u8]) -> String {
        let tag = hmac::sign(&self.mac, password);
        hex(&tag.as_ref()[..8])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sealed_password_opens_only_with_its_key_and_its_remote() {
        let k = RemoteKey::derive(b"a-cluster-secret-of-enough-bytes").expect("key");
        let pw = b"correct horse battery staple, long enough";
        let sealed = k.seal("b", pw);
        assert!(!sealed.contains("correct"), "never in the clear");
        assert_ne!(sealed, k.seal("b", pw), "a fresh nonce each time");
        assert_eq!(k.open("b", k.version(), &sealed).unwrap(), pw);
        // Another remote's name, another key, a damaged text: refused.
        assert_eq!(
            k.open("c", k.version(), &sealed),
            Err(OpenError::Unreadable)
        );
        let other = RemoteKey::derive(b"another-cluster-secret-entirely").expect("key");
        assert_ne!(other.version(), k.version());
        assert_eq!(
            other.open("b", k.version(), &sealed),
            Err(OpenError::KeyUnknown)
        );
        let mut bad = sealed.clone();
        bad.replace_range(30..32, if &sealed[30..32] == "00" { "01" } else { "00" });
        assert_eq!(k.open("b", k.version(), &bad), Err(OpenError::Unreadable));
        // Deterministic per key: the same secret gives the same version and fingerprints.
        let again = RemoteKey::derive(b"a-cluster-secret-of-enough-bytes").expect("key");
        assert_eq!(again.version(), k.version());
        assert_eq!(again.fingerprint(pw), k.fingerprint(pw));
        assert_ne!(other.fingerprint(pw), k.fingerprint(pw));
        assert_eq!(k.version().len(), 16);
        assert!(RemoteKey::derive(b"too-short").is_none());
    }
}
