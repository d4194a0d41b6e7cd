//! Seeding the root admin (SEMANTICS.md §15): on a secured node whose metadata has no users, the
//! user `admin` (`root: true`, grant `admin`) is created once through Raft. The password comes
//! from `NARAD_ADMIN_PASSWORD` (environment only, ignored once users exist); otherwise one is
//! generated and written to `admin-password` in the data directory (mode 0600, fsynced, then the
//! directory fsynced), or `admin-password.<unix ms>` when that file exists. The file is written
//! before the proposal: a crash in between leaves an unused file, never a root admin whose
//! password nobody can read. The password is never logged.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use narad_raft::{MetaCommand, MetaErrorKind, ProposeError};

use crate::node::Node;

pub use crate::config::ADMIN_PASSWORD_ENV;
/// The file a generated password is written to.
pub const ADMIN_PASSWORD_FILE: &str = "admin-password";
/// Random bytes of a generated password (rendered as 32 base64url characters).
const GENERATED_BYTES: usize = 24;
/// How long seeding waits for a Raft leader.
const LEADER_WAIT_MAX: Duration = Duration::from_secs(30);

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn generate_password() -> String {
    let mut b = [0u8; GENERATED_BYTES];
    narad_io::sys::fill_random(&mut b);
    crate::wire::base64::encode(&b)
        .replace('+', "-")
        .replace('/', "_")
        .trim_end_matches('=')
        .to_string()
}

/// Writes `password` to a new file in `dir` (mode 0600) and makes it durable.
fn write_password_file(dir: &Path, password: &str) -> Result<PathBuf, String> {
    let mut path = dir.join(ADMIN_PASSWORD_FILE);
    if path.exists() {
        path = dir.join(format!("{ADMIN_PASSWORD_FILE}.{}", now_ms()));
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(password.as_bytes())
        .and_then(|()| f.write_all(b"\n"))
        .and_then(|()| f.sync_all())
        .map_err(|e| format!("{}: {e}", path.display()))?;
    narad_io::durable::sync_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    Ok(path)
}

/// Seeds the root admin when security is on and no user exists (shard 0, at start-up).
pub async fn seed_root(node: &Rc<Node>) -> Result<(), String> {
    if !node.config.security_enabled || !node.meta().users.is_empty() {
        return Ok(());
    }
    let from_env = std::env::var(ADMIN_PASSWORD_ENV)
        .ok()
        .filter(|p| !p.is_empty());
    let (password, file) = match from_env {
        Some(p) => {
            if p.len() > super::PASSWORD_BYTES_MAX {
                return Err(format!(
                    "{ADMIN_PASSWORD_ENV} must be 1-{} bytes",
                    super::PASSWORD_BYTES_MAX
                ));
            }
            (p, None)
        }
        None => {
            let p = generate_password();
            let path = write_password_file(&node.config.data_dir, &p)?;
            (p, Some(path))
        }
    };
    let hash = super::node_auth()
        .hash_password(password.into_bytes())
        .await
        .map_err(|_| "hashing the root admin password failed".to_string())?;
    let start = std::time::Instant::now();
    loop {
        let cmd = MetaCommand::SeedRoot {
            password_hash: hash.clone(),
            created_at_ms: now_ms(),
        };
        match node.propose(cmd).await {
            Ok(_) => break,
            // Users appeared meanwhile: nothing to seed.
            Err(ProposeError::Apply(e)) if e.kind == MetaErrorKind::Conflict => {
                // Another node of the cluster seeded first: its password is the root's, and a
                // file here would name one that never works.
                if let Some(path) = &file {
                    let _ = std::fs::remove_file(path);
                }
                return Ok(());
            }
            Err(e) if start.elapsed() < LEADER_WAIT_MAX => {
                tracing::debug!(error = %e, "seeding the root admin: retrying");
                narad_io::rt::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(format!("seeding the root admin: {e}")),
        }
    }
    match file {
        Some(path) => tracing::info!(
            file = %path.display(),
            "seeded root admin with a generated password"
        ),
        None => tracing::info!("seeded root admin from {ADMIN_PASSWORD_ENV}"),
    }
    super::audit(
        "user.create",
        "system",
        narad_raft::apply::ROOT_USERNAME,
        201,
        "ok",
    );
    Ok(())
}
