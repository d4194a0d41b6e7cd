//! The `narad` CLI as an HTTP client of a broker (OPERATIONS.md §1): `topic`, `pub`, `sub`,
//! `replay`, `bench`, `user`, `remote`, `cluster`, `ctx`, `server report`, `version` and `completion`, with
//! the global connection flags `-s/-u/-p/--password-stdin/--ctx` and their environment variables
//! and contexts (§1.2).
//!
//! Owns: argument shapes (clap), output formats, connection settings (flag → env → context →
//! default, per field) and exit codes:
//!
//! | Code | Meaning |
//! |---|---|
//! | 0 | success |
//! | 1 | the server refused (its `error` text and the HTTP status are printed), including a route this server does not offer (404 `page not found`), or the user declined a confirmation |
//! | 2 | usage error, unreadable input or config, or no HTTP answer (cannot connect, timeout) |
//!
//! Never does: anything but HTTP through `client` (same routes and grants as curl), never links
//! the broker's runtime, never runs an async executor, never writes a file other than
//! `contexts.json`.
//!
//! Modules: `client` (blocking keep-alive HTTP/1.1), `context` (contexts.json and connection
//! settings), `topic` (topic admin and fan-out children), `pubsub` (`pub`, `sub`, `replay`),
//! `user`, `remote`, `cluster`, `report` (`server report`), `format` (durations, times, payloads).

pub mod client;
pub mod cluster;
pub mod context;
pub mod format;
pub mod pubsub;
pub mod remote;
pub mod report;
pub mod topic;
pub mod user;

use std::io::BufRead;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;

pub use client::{Client, Endpoint, Response, TransportError};

/// Where the CLI connects without `-s`, `NARAD_ADDR` or a context.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7942";
/// Longest secret line read from stdin (`--password-stdin` and friends); bcrypt takes 72 bytes.
pub const SECRET_LINE_BYTES_MAX: u64 = 4096;

/// Global connection flags (OPERATIONS.md §1.2). The environment is read by `context::resolve`,
/// not by clap, so that a flag, the environment and a context can be told apart.
#[derive(Args, Clone, Debug, Default)]
pub struct ConnArgs {
    /// Broker URL [env: NARAD_ADDR] (default: the selected context, else http://127.0.0.1:7942).
    #[arg(short = 's', long = "server", global = true, value_name = "URL")]
    pub server: Option<String>,
    /// User name for HTTP Basic auth [env: NARAD_USER].
    #[arg(short = 'u', long = "user", global = true, value_name = "NAME")]
    pub user: Option<String>,
    /// Password for HTTP Basic auth [env: NARAD_PASS].
    #[arg(short = 'p', long = "password", global = true, value_name = "PW")]
    pub password: Option<String>,
    /// Read the password from the first line of stdin.
    #[arg(long = "password-stdin", global = true, conflicts_with = "password")]
    pub password_stdin: bool,
    /// Use this context for one command (refused while NARAD_ADDR/USER/PASS is set).
    #[arg(long = "ctx", global = true, value_name = "NAME")]
    pub ctx: Option<String>,
}

/// The client subcommands, flattened into the binary's command tree.
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Manage topics and fan-out children.
    #[command(visible_alias = "topics")]
    Topic {
        #[command(subcommand)]
        command: topic::TopicCommand,
    },
    /// Produce a message: the argument, or the whole of --file or stdin (--lines: one per line).
    Pub(pubsub::PubArgs),
    /// Consume in queue mode: print and ack (or --peek: read-only tail).
    Sub(pubsub::SubArgs),
    /// Read one partition by offset, without leases.
    Replay(pubsub::ReplayArgs),
    /// Load generator (narad-bench).
    Bench(narad_bench::BenchArgs),
    /// Manage users and grants (admin).
    User {
        #[command(subcommand)]
        command: user::UserCommand,
    },
    /// Remote clusters that remote children ship to (admin, security on).
    Remote {
        #[command(subcommand)]
        command: remote::RemoteCommand,
    },
    /// Cluster administration (admin).
    Cluster {
        #[command(subcommand)]
        command: cluster::ClusterCommand,
    },
    /// Saved connection contexts (server, user, password) in contexts.json.
    Ctx {
        #[command(subcommand)]
        command: context::CtxCommand,
    },
    /// Print a shell completion script.
    Completion {
        #[arg(value_enum)]
        shell: CompletionShell,
    },
}

/// Shells `narad completion` writes scripts for.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum CompletionShell {
    Bash,
    Zsh,
    Fish,
    Powershell,
}

/// How a command failed; decides the exit code.
#[derive(Debug)]
pub enum CliError {
    /// Bad arguments, input or config (exit 2).
    Usage(String),
    /// No HTTP answer (exit 2).
    Transport(String),
    /// The server answered with an error status (exit 1).
    Refused { status: u16, message: String },
    /// Declined or failed on the client side after talking to the server (exit 1).
    Failed(String),
}

impl CliError {
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Transport(_) => 2,
            CliError::Refused { .. } | CliError::Failed(_) => 1,
        }
    }

    pub fn refused(r: &Response) -> CliError {
        CliError::Refused {
            status: r.status,
            message: r.error_text(),
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CliError::Usage(m) | CliError::Transport(m) | CliError::Failed(m) => f.write_str(m),
            CliError::Refused { status, message } => write!(f, "{message} (HTTP {status})"),
        }
    }
}

impl From<TransportError> for CliError {
    fn from(e: TransportError) -> CliError {
        CliError::Transport(e.0)
    }
}

/// Runs a client command and maps the outcome to an exit code, printing failures on stderr.
pub fn run(conn: ConnArgs, command: ClientCommand) -> ExitCode {
    exit(dispatch(conn, command))
}

/// `narad server report` (wired from the binary's `server` group).
pub fn run_server_report(conn: ConnArgs) -> ExitCode {
    exit(connect(&conn).and_then(|mut c| report::run(&mut c)))
}

/// `narad version`: the release, or `narad dev (<commit>)` for a non-release build. A release
/// build sets `NARAD_RELEASE` (e.g. `v3.2.2`) at compile time; `NARAD_COMMIT` names the commit.
pub fn version_line() -> String {
    match option_env!("NARAD_RELEASE") {
        Some(r) if !r.is_empty() => format!("narad {r}"),
        _ => format!(
            "narad dev ({})",
            option_env!("NARAD_COMMIT")
                .filter(|c| !c.is_empty())
                .unwrap_or(concat!("v", env!("CARGO_PKG_VERSION")))
        ),
    }
}

/// `narad completion <shell>`: writes the script for the binary's whole command tree.
pub fn print_completion(shell: CompletionShell, mut command: clap::Command) -> ExitCode {
    use clap_complete::Shell;
    let shell = match shell {
        CompletionShell::Bash => Shell::Bash,
        CompletionShell::Zsh => Shell::Zsh,
        CompletionShell::Fish => Shell::Fish,
        CompletionShell::Powershell => Shell::PowerShell,
    };
    // Into memory first: the generator panics on a failed write (say, a closed pipe).
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut command, "narad", &mut script);
    exit(print_text(&String::from_utf8_lossy(&script)))
}

fn exit(r: Result<(), CliError>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("narad: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// A client for the resolved connection settings; warns when credentials would travel in
/// plain text to a non-local host.
fn connect(conn: &ConnArgs) -> Result<Client, CliError> {
    let store = context::Store::load()?;
    let mut settings = context::resolve(conn, &|k| std::env::var(k).ok(), &store)?;
    if conn.password_stdin {
        settings.password = Some(read_secret_line("--password-stdin")?);
    }
    let endpoint = Endpoint::parse(&settings.server).map_err(CliError::Usage)?;
    if settings.user.is_some() && !endpoint.tls && !endpoint.is_local() {
        eprintln!(
            "narad: warning: sending credentials over plain http:// to {}",
            endpoint.host
        );
    }
    Ok(Client::new(
        endpoint,
        settings.user.as_deref(),
        settings.password.as_deref(),
    ))
}

fn dispatch(conn: ConnArgs, command: ClientCommand) -> Result<(), CliError> {
    match command {
        ClientCommand::Ctx { command } => return context::run(&conn, command),
        ClientCommand::Completion { .. } => {
            return Err(CliError::Usage(
                "completion is handled by the binary's entry point".into(),
            ))
        }
        _ => {}
    }
    let mut client = connect(&conn)?;
    match command {
        ClientCommand::Topic { command } => topic::run(&mut client, command),
        ClientCommand::Pub(a) => pubsub::publish(&mut client, a),
        ClientCommand::Sub(a) => pubsub::subscribe(&mut client, a),
        ClientCommand::Replay(a) => pubsub::replay(&mut client, a),
        ClientCommand::User { command } => user::run(&mut client, command),
        ClientCommand::Cluster { command } => cluster::run(&mut client, command),
        ClientCommand::Remote { command } => remote::run(&mut client, command),
        ClientCommand::Bench(mut a) => {
            if a.url.is_none() {
                let e = client.endpoint();
                if e.tls {
                    return Err(CliError::Usage(format!(
                        "narad bench speaks plain http:// only, and the server is {}; \
                         pass --url http://host:port (the broker itself, not the TLS front)",
                        e.url()
                    )));
                }
                a.url = Some(e.url());
            }
            if a.authorization.is_none() {
                a.authorization = client.authorization().map(str::to_string);
            }
            narad_bench::run_cli(a)
                .map(|_| ())
                .map_err(CliError::Failed)
        }
        ClientCommand::Ctx { .. } | ClientCommand::Completion { .. } => Ok(()),
    }
}

/// Reads one line from stdin (without its line end) as a secret; `what` names the flag.
pub(crate) fn read_secret_line(what: &str) -> Result<String, CliError> {
    use std::io::Read;
    let mut line = Vec::new();
    std::io::stdin()
        .lock()
        .take(SECRET_LINE_BYTES_MAX)
        .read_until(b'\n', &mut line)
        .map_err(|e| CliError::Usage(format!("{what}: reading stdin: {e}")))?;
    if line.last() == Some(&b'\n') {
        line.pop();
        if line.last() == Some(&b'\r') {
            line.pop();
        }
    }
    if line.is_empty() {
        return Err(CliError::Usage(format!(
            "{what}: no password on the first line of stdin"
        )));
    }
    String::from_utf8(line).map_err(|_| CliError::Usage(format!("{what}: not UTF-8")))
}

/// Sends one request and returns the answer when its status is 2xx. A `404` with the router's
/// plain `404 page not found` means this server does not offer the route at all (an older
/// release): that is said plainly, naming the route.
pub(crate) fn call(
    client: &mut Client,
    method: &str,
    path: &str,
    body: Option<&Value>,
) -> Result<Response, CliError> {
    let bytes = match body {
        Some(v) => serde_json::to_vec(v).map_err(|e| CliError::Usage(e.to_string()))?,
        None => Vec::new(),
    };
    let ct = body.map(|_| "application/json");
    let r = client.request(method, path, ct, &bytes, Duration::ZERO)?;
    ok_for(r, method, path)
}

/// `r` when its status is 2xx, else the refusal (see [`call`] for the route-missing case).
pub(crate) fn ok_for(r: Response, method: &str, path: &str) -> Result<Response, CliError> {
    if (200..300).contains(&r.status) {
        return Ok(r);
    }
    if r.status == 404 && r.is_route_missing() {
        let route = path.split('?').next().unwrap_or(path);
        return Err(CliError::Refused {
            status: 404,
            message: format!(
                "this server does not offer {method} {route} (404 page not found): it runs a \
                 release without this feature"
            ),
        });
    }
    Err(CliError::refused(&r))
}

/// Parses a JSON answer.
pub(crate) fn json_body(r: &Response) -> Result<Value, CliError> {
    serde_json::from_slice(&r.body)
        .map_err(|e| CliError::Failed(format!("the server answered invalid JSON: {e}")))
}

/// Prints a JSON answer indented on stdout.
pub(crate) fn print_pretty(r: &Response) -> Result<(), CliError> {
    let v = json_body(r)?;
    print_value(&v)
}

pub(crate) fn print_value(v: &Value) -> Result<(), CliError> {
    use std::io::Write;
    let mut text = serde_json::to_string_pretty(v).unwrap_or_default();
    text.push('\n');
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| CliError::Failed(format!("writing output: {e}")))
}

/// Writes `text` to stdout.
pub(crate) fn print_text(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|_| out.flush())
        .map_err(|e| CliError::Failed(format!("writing output: {e}")))
}

/// Left-aligned columns separated by two spaces, trailing blanks trimmed, one line per row.
pub(crate) fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let mut width = vec![0; cols];
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.iter().enumerate() {
            line.push_str(c);
            if i + 1 < r.len() {
                let pad = width[i] - c.chars().count() + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_columns() {
        let t = table(&[
            vec!["NAME".into(), "N".into(), "X".into()],
            vec!["orders".into(), "12".into(), "".into()],
        ]);
        assert_eq!(t, "NAME    N   X\norders  12\n");
    }
}
