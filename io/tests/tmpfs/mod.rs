//! A small tmpfs mounted for a disk-full test, unmounted on drop. Shared by the WAL and the
//! ShardLog disk-full tests, the broker's (`tests/disk_full.rs`) and the Raft store's.

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Mount(pub PathBuf);

impl Mount {
    /// Mounts a tmpfs of `bytes` at `path`. `None` (the test then says it is skipped) only when
    /// not running as root; as root (CI) a failed mount fails the test, so it cannot pass silently.
    pub fn tmpfs(path: &Path, bytes: u64) -> Option<Mount> {
        let mounted = std::fs::create_dir_all(path).is_ok()
            && Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
                .arg(path)
                .status()
                .is_ok_and(|s| s.success());
        if mounted {
            return Some(Mount(path.to_path_buf()));
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let root = unsafe { libc::geteuid() } == 0;
        assert!(
            !root,
            "running as root but could not mount a tmpfs at {}",
            path.display()
        );
        eprintln!(
            "skipped: cannot mount tmpfs at {} (needs root)",
            path.display()
        );
        None
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        // Lazy: files the test's executor dropped without closing are only closed when the
        // process exits, so a plain umount finds the mount busy and leaves it behind.
        let _ = Command::new("umount").arg("--lazy").arg(&self.0).status();
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Fills the file system of `dir` to the last byte with a file there, `fill-all`; returns its
/// path (delete it to free the space).
#[allow(dead_code)] // each test crate that includes this module uses part of it
pub fn fill_to_the_last_byte(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("fill-all");
    let mut f = std::fs::File::create(&path).unwrap();
    for chunk in [1 << 20, 4096, 512, 1] {
        let buf = vec![0x33u8; chunk];
        loop {
            match f.write_all(&buf) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull => break,
                Err(e) => panic!("filling {}: {e}", path.display()),
            }
        }
    }
    f.sync_all().unwrap();
    path
}
