//! Names the commit a non-release build came from, for `narad version` (OPERATIONS.md §1:
//! `narad dev (<commit>)`). `NARAD_COMMIT` from the environment wins (the Dockerfile's build
//! argument: its context has no `.git`); otherwise `git rev-parse` is asked, and when there is no
//! git or no repository the version falls back to the package version (`src/cli/mod.rs`).

use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    let s = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (out.status.success() && !s.is_empty()).then_some(s)
}

fn main() {
    println!("cargo:rerun-if-env-changed=NARAD_COMMIT");
    if std::env::var("NARAD_COMMIT").is_ok_and(|c| !c.is_empty()) {
        return;
    }
    let Some(commit) = git(&["rev-parse", "--short=12", "HEAD"]) else {
        return;
    };
    // Rebuild when HEAD moves: HEAD itself (a checkout) and the branch it names (a commit).
    for path in [
        git(&["rev-parse", "--git-path", "HEAD"]),
        git(&["symbolic-ref", "-q", "HEAD"]).and_then(|r| git(&["rev-parse", "--git-path", &r])),
    ]
    .into_iter()
    .flatten()
    {
        println!("cargo:rerun-if-changed={path}");
    }
    println!("cargo:rustc-env=NARAD_COMMIT={commit}");
}
