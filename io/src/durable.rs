//! Durable replacement of small files and the blocking file-system primitives under it: the one
//! implementation of "temp file, fdatasync, rename, directory fsync", of the directory fsync and
//! of `fallocate` that every crate uses (the metadata store, consumer state, segment indexes,
//! fan-out cursors, the data directory's `shards` file).
//!
//! Owns: the temp file's name (`<name>.tmp` next to the file it replaces), the order of the
//! steps, and space reservation with `fallocate`. Never decides what a file holds, never retries
//! (an fsync error is returned as it is: the page cache can no longer be trusted, and the caller
//! stops), and never runs on an executor's ring: these are blocking `std::fs` calls for
//! `spawn_blocking` helpers, start-up and the rare metadata writes. The direct-I/O files of the
//! WAL sync their directory over the ring instead ([`crate::file::sync_dir`]).
//!
//! # Crash safety of [`replace_file`]
//! 1. `<name>.tmp` is created (or truncated), written whole and fdatasync'ed. Until its rename,
//!    nothing anybody reads as `<name>` has changed, so a crash or a failure here (a full disk)
//!    leaves the old file intact; a stale `<name>.tmp` is only ever overwritten, never read.
//! 2. The temp file is renamed over `<name>`. rename(2) replaces the directory entry atomically:
//!    a reader sees the old file or the new one, never a mix. Because step 1 synced the data
//!    first, the new name can only ever point at complete content (without that sync, a crash
//!    could persist the rename before the data and leave `<name>` empty or short).
//! 3. The directory is fsynced. Only then is the rename itself durable: before it, a crash may
//!    bring back the old file, which is why a caller acknowledges nothing before this returns.
//!
//! Callers that rename several files in one directory may use [`write_temp`] and
//! [`rename_temp`] and fsync the directory once with [`sync_dir`] afterwards; the argument is
//! the same, with step 3 shared.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// The temp file [`replace_file`] writes before renaming it over `path`: `path` with `.tmp`
/// appended to its file name, in the same directory (rename(2) is atomic only within one file
/// system).
pub fn temp_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".tmp");
    PathBuf::from(p)
}

/// Replaces `path` with `bytes` so that after a crash either the old or the new content is
/// found, whole: temp file, fdatasync, rename, directory fsync (the argument is in the module
/// doc). Returns once the replacement is durable.
pub fn replace_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_temp(path, bytes)?;
    install_temp(path)
}

/// Step 1 of [`replace_file`]: [`temp_path`]`(path)` created (or truncated), written with
/// `bytes` and fdatasync'ed. Nothing a reader of `path` sees has changed yet, so a failure here
/// (a full disk) can be given up on.
pub fn write_temp(path: &Path, bytes: &[u8]) -> io::Result<()> {
    write_temp_with(path, bytes, None)
}

/// [`write_temp`], the temp file created with permissions `mode` (before the umask), and set to
/// exactly `mode` when it already existed with others (for files holding secrets).
pub fn write_temp_mode(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    write_temp_with(path, bytes, Some(mode))
}

fn write_temp_with(path: &Path, bytes: &[u8], mode: Option<u32>) -> io::Result<()> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let tmp = temp_path(path);
    let mut o = std::fs::OpenOptions::new();
    o.write(true).create(true).truncate(true);
    if let Some(mode) = mode {
        o.mode(mode);
    }
    let mut f = o.open(&tmp)?;
    if let Some(mode) = mode {
        // open() keeps the permissions of a file that already existed.
        f.set_permissions(std::fs::Permissions::from_mode(mode))?;
    }
    f.write_all(bytes)?;
    f.sync_data()
}

/// Steps 2 and 3 of [`replace_file`]: the temp file written by [`write_temp`] renamed over
/// `path`, then the directory fsynced.
pub fn install_temp(path: &Path) -> io::Result<()> {
    rename_temp(path)?;
    sync_dir(parent_dir(path))
}

/// Step 2 of [`replace_file`] alone: the temp file renamed over `path`. The rename is not durable
/// until the caller fsyncs the directory ([`sync_dir`]).
pub fn rename_temp(path: &Path) -> io::Result<()> {
    std::fs::rename(temp_path(path), path)
}

/// fsyncs a directory, so that files created, renamed or removed in it stay so after a crash.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

/// The directory holding `path` (the current directory for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    }
}

/// Reserves disk blocks for `[from, from + len)` of `file` without changing its length
/// (`fallocate(FALLOC_FL_KEEP_SIZE)`): later writes there need no allocation, so a full disk
/// shows here, where the caller can still refuse, instead of in the middle of a write. A file
/// system that cannot reserve answers an error for which [`crate::file::is_unsupported`] holds.
pub fn reserve_blocks(file: &File, from: u64, len: u64) -> io::Result<()> {
    fallocate(file, libc::FALLOC_FL_KEEP_SIZE, from, len)
}

/// Allocates disk blocks for `[0, len)` of `file`, extending it with zeros to at least `len`
/// bytes (`fallocate` mode 0): writing up to `len` later needs no new blocks.
pub fn allocate(file: &File, len: u64) -> io::Result<()> {
    fallocate(file, 0, 0, len)
}

/// `fallocate(mode)` of `[from, from + len)`; a range past what `off_t` holds is `EFBIG`.
fn fallocate(file: &File, mode: libc::c_int, from: u64, len: u64) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let (Ok(from), Ok(len)) = (libc::off_t::try_from(from), libc::off_t::try_from(len)) else {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    };
    // SAFETY: fallocate on a descriptor `file` owns; no memory is passed. It changes no content
    // (mode 0 extends the length with zeros, KEEP_SIZE leaves the length).
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), mode, from, len) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn test_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("narad-durable-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn replace_file_swaps_whole_contents_through_the_tmp_name() {
        // Proves replace_file writes the new content under `<name>.tmp` and leaves only `<name>`
        // behind, and that a temp file written but not installed changes nothing a reader of
        // `<name>` sees (what a crash between steps 1 and 2 leaves).
        let dir = test_dir("replace");
        let path = dir.join("consumer.state");
        assert_eq!(temp_path(&path), dir.join("consumer.state.tmp"));
        replace_file(&path, b"old").unwrap();
        write_temp(&path, b"new, not installed").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"old");
        replace_file(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(left, [std::ffi::OsString::from("consumer.state")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn write_temp_mode_narrows_an_existing_temp_file() {
        // Proves a temp file holding a secret ends with exactly the asked permissions, also when
        // a wider one of that name was left behind.
        let dir = test_dir("mode");
        let path = dir.join("contexts.json");
        std::fs::write(temp_path(&path), b"x").unwrap();
        std::fs::set_permissions(temp_path(&path), std::fs::Permissions::from_mode(0o644)).unwrap();
        write_temp_mode(&path, b"secret", 0o600).unwrap();
        let mode = std::fs::metadata(temp_path(&path)).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        rename_temp(&path).unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"secret");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn reserve_keeps_the_length_and_allocate_extends_it() {
        // Proves reserve_blocks allocates without changing the file's length (what recovery
        // scans) and allocate makes the file at least that long; a range beyond off_t is EFBIG.
        // A file system without fallocate (EOPNOTSUPP) skips the block counts.
        let dir = test_dir("falloc");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(dir.join("f"))
            .unwrap();
        match reserve_blocks(&f, 0, 1 << 20) {
            Err(e) if crate::file::is_unsupported(&e) => {}
            r => {
                r.unwrap();
                let m = f.metadata().unwrap();
                assert_eq!(m.len(), 0);
                assert!(m.blocks() * 512 >= 1 << 20, "{} blocks", m.blocks());
                allocate(&f, 8192).unwrap();
                assert_eq!(f.metadata().unwrap().len(), 8192);
            }
        }
        let e = reserve_blocks(&f, u64::MAX, 1).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFBIG));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
