//! Connection settings of the CLI (OPERATIONS.md §1.2): saved contexts in `contexts.json` and
//! the per-field precedence flag → environment → context → default.
//!
//! Owns: `contexts.json` (in `$NARAD_CONFIG_DIR`, else the user config dir's `narad/` folder,
//! `~/.config/narad/` on Linux), written whole to a temporary file with mode 0600, fsynced and
//! renamed over the old one, so a crash leaves the old or the new file, never half of one.
//! Passwords are stored in plain text, as the spec says; the file mode is the protection.
//! Never does: talk to a broker.
//!
//! Format (JSON): `{"current":"<name>","contexts":{"<name>":{"server":"<url>","user":"<u>",
//! "password":"<p>"}}}`; `user` and `password` are omitted when not set.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use clap::Subcommand;
use narad_io::durable;
use serde::{Deserialize, Serialize};

use super::{CliError, ConnArgs, Endpoint, DEFAULT_SERVER};

/// File name inside the config directory.
pub const CONTEXTS_FILE: &str = "contexts.json";
/// Largest contexts.json read.
pub const CONTEXTS_FILE_BYTES_MAX: u64 = 1 << 20;
/// Contexts kept at most.
pub const CONTEXTS_MAX: usize = 1000;
/// Longest context name.
pub const CONTEXT_NAME_BYTES_MAX: usize = 64;

/// Environment variables of the global flags.
pub const ENV_ADDR: &str = "NARAD_ADDR";
pub const ENV_USER: &str = "NARAD_USER";
pub const ENV_PASS: &str = "NARAD_PASS";

#[derive(Subcommand, Debug)]
pub enum CtxCommand {
    /// Save a context: --server URL [--user U] [--password P | --password-stdin].
    /// The first context added becomes the selected one.
    Add { name: String },
    /// Make a context the default of every command.
    Select { name: String },
    /// List contexts (`*` marks the selected one; passwords are never printed).
    Ls,
    /// Remove a context.
    Rm { name: String },
}

/// One saved context.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct Context {
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<String>,
}

/// The contents of contexts.json.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Contexts {
    /// The selected context; empty when none.
    #[serde(default)]
    pub current: String,
    #[serde(default)]
    pub contexts: BTreeMap<String, Context>,
}

/// contexts.json and where it lives.
pub struct Store {
    /// None when no config directory can be named (no HOME and no NARAD_CONFIG_DIR).
    pub dir: Option<PathBuf>,
    pub data: Contexts,
}

/// The config directory: `$NARAD_CONFIG_DIR`, else the platform's user config dir + `narad`.
pub fn config_dir(env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    let get = |k: &str| env(k).filter(|v| !v.is_empty());
    if let Some(d) = get("NARAD_CONFIG_DIR") {
        return Some(PathBuf::from(d));
    }
    let base = if cfg!(target_os = "windows") {
        get("APPDATA").map(PathBuf::from)
    } else if cfg!(target_os = "macos") {
        get("HOME").map(|h| Path::new(&h).join("Library").join("Application Support"))
    } else {
        get("XDG_CONFIG_HOME")
            .map(PathBuf::from)
            .or_else(|| get("HOME").map(|h| Path::new(&h).join(".config")))
    }?;
    Some(base.join("narad"))
}

impl Store {
    /// Reads contexts.json; a missing file is an empty store.
    pub fn load() -> Result<Store, CliError> {
        let dir = config_dir(&|k| std::env::var(k).ok());
        let Some(d) = &dir else {
            return Ok(Store {
                dir,
                data: Contexts::default(),
            });
        };
        let path = d.join(CONTEXTS_FILE);
        let data = match std::fs::File::open(&path) {
            Ok(f) => {
                let mut text = Vec::new();
                f.take(CONTEXTS_FILE_BYTES_MAX + 1)
                    .read_to_end(&mut text)
                    .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?;
                if text.len() as u64 > CONTEXTS_FILE_BYTES_MAX {
                    return Err(CliError::Usage(format!(
                        "{}: larger than {CONTEXTS_FILE_BYTES_MAX} bytes",
                        path.display()
                    )));
                }
                serde_json::from_slice(&text)
                    .map_err(|e| CliError::Usage(format!("{}: {e}", path.display())))?
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Contexts::default(),
            Err(e) => return Err(CliError::Usage(format!("{}: {e}", path.display()))),
        };
        Ok(Store { dir, data })
    }

    /// Writes contexts.json (mode 0600) via a fsynced temporary file and a rename.
    pub fn save(&self) -> Result<PathBuf, CliError> {
        let dir = self.dir.as_ref().ok_or_else(|| {
            CliError::Usage(
                "no config directory: set NARAD_CONFIG_DIR or HOME to save contexts".into(),
            )
        })?;
        let io = |p: &Path, e: std::io::Error| CliError::Usage(format!("{}: {e}", p.display()));
        let mut builder = std::fs::DirBuilder::new();
        builder.recursive(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::DirBuilderExt;
            builder.mode(0o700);
        }
        builder.create(dir).map_err(|e| io(dir, e))?;
        let path = dir.join(CONTEXTS_FILE);
        let mut text = serde_json::to_vec_pretty(&self.data)
            .map_err(|e| CliError::Usage(format!("encoding contexts: {e}")))?;
        text.push(b'\n');
        // Passwords inside: mode 0600, also over an older temp file of a wider mode.
        durable::write_temp_mode(&path, &text, 0o600)
            .map_err(|e| io(&durable::temp_path(&path), e))?;
        durable::rename_temp(&path).map_err(|e| io(&path, e))?;
        // Make the rename itself durable (best effort: the file is already complete).
        let _ = durable::sync_dir(dir);
        Ok(path)
    }
}

/// Connection settings after precedence.
#[derive(Debug, PartialEq, Eq)]
pub struct Settings {
    pub server: String,
    pub user: Option<String>,
    pub password: Option<String>,
}

/// Applies flag → environment → context (`--ctx`, else the selected one) → default, per field.
/// Each field on its own (OPERATIONS.md §1.2): `-u bob` with a selected context keeps the
/// context's password.
/// `--ctx` is refused while any of NARAD_ADDR/USER/PASS is set (OPERATIONS.md §1.2).
pub fn resolve(
    conn: &ConnArgs,
    env: &dyn Fn(&str) -> Option<String>,
    store: &Store,
) -> Result<Settings, CliError> {
    let get = |k: &str| env(k).filter(|v| !v.is_empty());
    let ctx = match &conn.ctx {
        Some(name) => {
            let set: Vec<&str> = [ENV_ADDR, ENV_USER, ENV_PASS]
                .into_iter()
                .filter(|k| get(k).is_some())
                .collect();
            if !set.is_empty() {
                return Err(CliError::Usage(format!(
                    "--ctx is refused while {} is set: unset it or drop --ctx",
                    set.join("/")
                )));
            }
            Some(store.data.contexts.get(name).ok_or_else(|| {
                CliError::Usage(format!("no context named {name:?} (see `narad ctx ls`)"))
            })?)
        }
        None => store.data.contexts.get(&store.data.current),
    };
    let server = conn
        .server
        .clone()
        .or_else(|| get(ENV_ADDR))
        .or_else(|| ctx.map(|c| c.server.clone()))
        .unwrap_or_else(|| DEFAULT_SERVER.to_string());
    let user = conn
        .user
        .clone()
        .or_else(|| get(ENV_USER))
        .or_else(|| ctx.and_then(|c| c.user.clone()));
    let password = conn
        .password
        .clone()
        .or_else(|| get(ENV_PASS))
        .or_else(|| ctx.and_then(|c| c.password.clone()));
    Ok(Settings {
        server,
        user,
        password,
    })
}

fn check_name(name: &str) -> Result<(), CliError> {
    let ok = !name.is_empty()
        && name.len() <= CONTEXT_NAME_BYTES_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(CliError::Usage(format!(
            "context name {name:?}: use 1-{CONTEXT_NAME_BYTES_MAX} of A-Z a-z 0-9 . _ -"
        )))
    }
}

/// `narad ctx ...`. The settings of `ctx add` come from the global flags only (never from the
/// environment or another context).
pub fn run(conn: &ConnArgs, cmd: CtxCommand) -> Result<(), CliError> {
    let mut store = Store::load()?;
    match cmd {
        CtxCommand::Add { name } => {
            check_name(&name)?;
            let server = conn
                .server
                .clone()
                .ok_or_else(|| CliError::Usage("ctx add: --server URL is required".into()))?;
            Endpoint::parse(&server).map_err(CliError::Usage)?;
            let password = if conn.password_stdin {
                Some(super::read_secret_line("--password-stdin")?)
            } else {
                conn.password.clone()
            };
            if password.is_some() && conn.user.is_none() {
                return Err(CliError::Usage("ctx add: a password needs --user".into()));
            }
            let existed = store.data.contexts.contains_key(&name);
            if !existed && store.data.contexts.len() >= CONTEXTS_MAX {
                return Err(CliError::Usage(format!(
                    "ctx add: {CONTEXTS_MAX} contexts already; remove one first"
                )));
            }
            store.data.contexts.insert(
                name.clone(),
                Context {
                    server,
                    user: conn.user.clone(),
                    password,
                },
            );
            let first = store.data.contexts.len() == 1;
            if first {
                store.data.current = name.clone();
            }
            let path = store.save()?;
            eprintln!(
                "{} context \"{name}\"{} in {}",
                if existed { "updated" } else { "added" },
                if first { " (selected)" } else { "" },
                path.display()
            );
            Ok(())
        }
        CtxCommand::Select { name } => {
            if !store.data.contexts.contains_key(&name) {
                return Err(CliError::Usage(format!(
                    "no context named {name:?} (see `narad ctx ls`)"
                )));
            }
            store.data.current = name.clone();
            store.save()?;
            eprintln!("selected context \"{name}\"");
            Ok(())
        }
        CtxCommand::Ls => {
            let mut rows = vec![vec![
                "CURRENT".to_string(),
                "NAME".into(),
                "SERVER".into(),
                "USER".into(),
            ]];
            for (name, c) in &store.data.contexts {
                rows.push(vec![
                    if *name == store.data.current { "*" } else { "" }.into(),
                    name.clone(),
                    c.server.clone(),
                    c.user.clone().unwrap_or_default(),
                ]);
            }
            super::print_text(&super::table(&rows))
        }
        CtxCommand::Rm { name } => {
            if store.data.contexts.remove(&name).is_none() {
                return Err(CliError::Usage(format!(
                    "no context named {name:?} (see `narad ctx ls`)"
                )));
            }
            if store.data.current == name {
                store.data.current.clear();
            }
            store.save()?;
            eprintln!("removed context \"{name}\"");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store() -> Store {
        let mut data = Contexts::default();
        data.contexts.insert(
            "prod".into(),
            Context {
                server: "http://prod:7942".into(),
                user: Some("alice".into()),
                password: Some("pw-a".into()),
            },
        );
        data.contexts.insert(
            "dev".into(),
            Context {
                server: "http://dev:7942".into(),
                user: None,
                password: None,
            },
        );
        data.current = "prod".into();
        Store { dir: None, data }
    }

    fn env(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn flag_beats_env_beats_context_beats_default() {
        let s = store();
        let none = ConnArgs::default();
        let r = resolve(&none, &env(&[]), &s).unwrap();
        assert_eq!(
            (r.server.as_str(), r.user.as_deref(), r.password.as_deref()),
            ("http://prod:7942", Some("alice"), Some("pw-a"))
        );
        let r = resolve(
            &none,
            &env(&[(ENV_ADDR, "http://e:1"), (ENV_USER, "bob"), (ENV_PASS, "")]),
            &s,
        )
        .unwrap();
        // Per field: an empty NARAD_PASS is unset, so the context's password stays with bob.
        assert_eq!(
            (r.server.as_str(), r.user.as_deref(), r.password.as_deref()),
            ("http://e:1", Some("bob"), Some("pw-a"))
        );
        let r = resolve(
            &ConnArgs {
                user: Some("fu".into()),
                ..Default::default()
            },
            &env(&[]),
            &s,
        )
        .unwrap();
        assert_eq!(
            (r.server.as_str(), r.user.as_deref(), r.password.as_deref()),
            ("http://prod:7942", Some("fu"), Some("pw-a"))
        );
        let r = resolve(&none, &env(&[(ENV_PASS, "ep")]), &s).unwrap();
        assert_eq!(
            (r.user.as_deref(), r.password.as_deref()),
            (Some("alice"), Some("ep"))
        );
        let flags = ConnArgs {
            server: Some("http://f:2".into()),
            user: Some("carol".into()),
            password: Some("pw-c".into()),
            ..Default::default()
        };
        let r = resolve(
            &flags,
            &env(&[(ENV_ADDR, "http://e:1"), (ENV_USER, "bob"), (ENV_PASS, "x")]),
            &s,
        )
        .unwrap();
        assert_eq!(
            (r.server.as_str(), r.user.as_deref(), r.password.as_deref()),
            ("http://f:2", Some("carol"), Some("pw-c"))
        );
        let empty = Store {
            dir: None,
            data: Contexts::default(),
        };
        let r = resolve(&none, &env(&[]), &empty).unwrap();
        assert_eq!(
            r,
            Settings {
                server: DEFAULT_SERVER.into(),
                user: None,
                password: None
            }
        );
    }

    #[test]
    fn ctx_flag_picks_a_context_and_is_refused_with_env() {
        let s = store();
        let c = ConnArgs {
            ctx: Some("dev".into()),
            ..Default::default()
        };
        let r = resolve(&c, &env(&[]), &s).unwrap();
        assert_eq!((r.server.as_str(), r.user), ("http://dev:7942", None));
        let e = resolve(&c, &env(&[(ENV_USER, "x")]), &s).unwrap_err();
        assert!(e.to_string().contains("NARAD_USER"), "{e}");
        assert_eq!(e.exit_code(), 2);
        let c = ConnArgs {
            ctx: Some("nope".into()),
            ..Default::default()
        };
        assert!(resolve(&c, &env(&[]), &s).is_err());
    }

    #[test]
    fn config_dir_order() {
        assert_eq!(
            config_dir(&env(&[("NARAD_CONFIG_DIR", "/c"), ("HOME", "/h")])),
            Some(PathBuf::from("/c"))
        );
        if cfg!(target_os = "linux") {
            assert_eq!(
                config_dir(&env(&[("HOME", "/h")])),
                Some(PathBuf::from("/h/.config/narad"))
            );
            assert_eq!(
                config_dir(&env(&[("XDG_CONFIG_HOME", "/x"), ("HOME", "/h")])),
                Some(PathBuf::from("/x/narad"))
            );
        }
        assert_eq!(config_dir(&env(&[])), None);
    }
}
