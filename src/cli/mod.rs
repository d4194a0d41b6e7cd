//! The `narad` CLI as an HTTP client of a broker (OPERATIONS.md §1): `topic`, `pub`, `sub`,
//! `replay` and `bench`, with the global `-s/-u/-p` connection flags.
//!
//! Owns: argument shapes (clap), output formats and exit codes: 0 ok, 1 the server refused (its
//! `error` text is printed), 2 usage or connection error. Never does: anything but HTTP through
//! `client` (same routes and grants as curl), never links the broker's runtime, never runs an
//! async executor.
//!
//! Modules: `client` (blocking keep-alive HTTP/1.1), `topic` (topic admin), `pubsub` (`pub`,
//! `sub`, `replay`), `format` (durations, times, payload rendering).

pub mod client;
pub mod format;
pub mod pubsub;
pub mod topic;

use std::process::ExitCode;

use clap::{Args, Subcommand};

pub use client::{Client, Endpoint, Response, TransportError};

/// Where the CLI connects without `-s` or `NARAD_ADDR`.
pub const DEFAULT_SERVER: &str = "http://127.0.0.1:7942";

/// Global connection flags (OPERATIONS.md §1.2; contexts are not implemented).
#[derive(Args, Clone, Debug)]
pub struct ConnArgs {
    /// Broker URL.
    #[arg(short = 's', long = "server", env = "NARAD_ADDR", global = true, default_value = DEFAULT_SERVER)]
    pub server: String,
    /// User name for HTTP Basic auth.
    #[arg(short = 'u', long = "user", env = "NARAD_USER", global = true)]
    pub user: Option<String>,
    /// Password for HTTP Basic auth.
    #[arg(
        short = 'p',
        long = "password",
        env = "NARAD_PASS",
        global = true,
        hide_env_values = true
    )]
    pub password: Option<String>,
}

/// The client subcommands, flattened into the binary's command tree.
#[derive(Subcommand, Debug)]
pub enum ClientCommand {
    /// Manage topics.
    #[command(visible_alias = "topics")]
    Topic {
        #[command(subcommand)]
        command: topic::TopicCommand,
    },
    /// Produce messages: the argument, --file, or stdin (one message per line).
    Pub(pubsub::PubArgs),
    /// Consume in queue mode: print and ack.
    Sub(pubsub::SubArgs),
    /// Read one partition by offset, without leases.
    Replay(pubsub::ReplayArgs),
    /// Load generator (narad-bench).
    Bench(narad_bench::BenchArgs),
}

/// How a command failed; decides the exit code.
#[derive(Debug)]
pub enum CliError {
    /// Bad arguments or input (exit 2).
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
    match dispatch(conn, command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("narad: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn dispatch(conn: ConnArgs, command: ClientCommand) -> Result<(), CliError> {
    let endpoint = Endpoint::parse(&conn.server).map_err(CliError::Usage)?;
    let mut client = Client::new(endpoint, conn.user.as_deref(), conn.password.as_deref());
    match command {
        ClientCommand::Topic { command } => topic::run(&mut client, command),
        ClientCommand::Pub(a) => pubsub::publish(&mut client, a),
        ClientCommand::Sub(a) => pubsub::subscribe(&mut client, a),
        ClientCommand::Replay(a) => pubsub::replay(&mut client, a),
        ClientCommand::Bench(mut a) => {
            if a.url.is_none() {
                let e = client.endpoint();
                a.url = Some(format!("http://{}:{}{}", e.host, e.port, e.prefix));
            }
            if a.authorization.is_none() {
                a.authorization = client.authorization().map(str::to_string);
            }
            narad_bench::run_cli(a)
                .map(|_| ())
                .map_err(CliError::Failed)
        }
    }
}
