//! The `narad` binary: broker and CLI in one (OPERATIONS.md §1).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use narad::config::{Config, FlagOverrides};

#[derive(Parser)]
#[command(name = "narad", about = "Narad: a small, sturdy, fast message broker")]
struct Cli {
    #[command(flatten)]
    conn: narad::cli::ConnArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a broker.
    Server {
        #[command(subcommand)]
        command: ServerCommand,
    },
    /// Production entry point (container default).
    Serve(ServeArgs),
    /// Print the release.
    Version,
    #[command(flatten)]
    Client(narad::cli::ClientCommand),
}

#[derive(Subcommand)]
enum ServerCommand {
    /// Run a broker (a local playground with --dev).
    Start {
        /// Local playground: loopback only, auth off, data in ~/.narad/data.
        #[arg(long)]
        dev: bool,
        #[arg(long)]
        port: Option<u16>,
        #[arg(long = "data-dir")]
        data_dir: Option<PathBuf>,
    },
    /// One table of every topic: TOPIC, PARTS, MESSAGES, SIZE, OWNERS, ROLE.
    Report,
}

#[derive(clap::Args, Default)]
struct ServeArgs {
    /// JSON config file.
    #[arg(long)]
    config: Option<PathBuf>,
    #[arg(long)]
    addr: Option<String>,
    #[arg(long)]
    port: Option<u16>,
    #[arg(long = "cluster-port")]
    cluster_port: Option<u16>,
    #[arg(long = "node-id")]
    node_id: Option<String>,
    #[arg(long = "data-dir")]
    data_dir: Option<PathBuf>,
    #[arg(long = "log-level")]
    log_level: Option<String>,
    #[arg(long = "log-format")]
    log_format: Option<String>,
    #[arg(long = "pprof-addr")]
    pprof_addr: Option<String>,
}

fn env_map() -> BTreeMap<String, String> {
    std::env::vars()
        .filter(|(k, _)| k.starts_with("NARAD_"))
        .collect()
}

/// mimalloc instead of glibc's malloc: the request path allocates and frees many small buffers
/// on every shard thread; see the commit that added it for the measured difference.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // `--version` prints what `narad version` prints (clap prints "narad <version>").
    let version: &'static str = Box::leak(narad::cli::version_line().into_boxed_str());
    let command = Cli::command().version(version.strip_prefix("narad ").unwrap_or(version));
    let cli = Cli::from_arg_matches(&command.get_matches()).unwrap_or_else(|e| e.exit());
    let runs_a_server = matches!(
        cli.command,
        Command::Serve(_)
            | Command::Server {
                command: ServerCommand::Start { .. }
            }
    );
    if runs_a_server {
        if let Some(flag) = client_flag_given(&cli.conn) {
            // `serve -p 8080` would otherwise start on the default port with a password set.
            eprintln!(
                "narad: {flag} is a client flag and has no meaning for a server; the server's \
                 port is --port (or --addr), its users come from the config"
            );
            return ExitCode::from(2);
        }
    }
    match cli.command {
        Command::Version => {
            println!("{version}");
            ExitCode::SUCCESS
        }
        Command::Server {
            command: ServerCommand::Report,
        } => narad::cli::run_server_report(cli.conn),
        Command::Client(narad::cli::ClientCommand::Completion { shell }) => {
            narad::cli::print_completion(shell, Cli::command())
        }
        Command::Server {
            command:
                ServerCommand::Start {
                    dev,
                    port,
                    data_dir,
                },
        } => {
            if dev {
                start_dev(port, data_dir)
            } else {
                serve(ServeArgs {
                    port: port.filter(|&p| p != 7942),
                    data_dir,
                    ..Default::default()
                })
            }
        }
        Command::Serve(args) => serve(args),
        Command::Client(command) => narad::cli::run(cli.conn, command),
    }
}

/// The first client-only global flag given on the command line, if any.
fn client_flag_given(conn: &narad::cli::ConnArgs) -> Option<&'static str> {
    [
        (conn.server.is_some(), "-s/--server"),
        (conn.user.is_some(), "-u/--user"),
        (conn.password.is_some(), "-p/--password"),
        (conn.password_stdin, "--password-stdin"),
        (conn.ctx.is_some(), "--ctx"),
    ]
    .into_iter()
    .find_map(|(given, flag)| given.then_some(flag))
}

fn start_dev(port: Option<u16>, data_dir: Option<PathBuf>) -> ExitCode {
    let port = port.unwrap_or(7942);
    let data_dir = data_dir.unwrap_or_else(|| {
        let home = std::env::var_os("HOME")
            .map(PathBuf::from)
            .unwrap_or_else(|| ".".into());
        home.join(".narad").join("data")
    });
    let mut env = env_map();
    env.insert("NARAD_SECURITY_ENABLED".into(), "false".into());
    env.entry("NARAD_CLUSTER_ADDR".into())
        .or_insert_with(|| format!("127.0.0.1:{}", port.wrapping_add(1)));
    env.insert("NARAD_LOG_FORMAT".into(), "text".into());
    let flags = FlagOverrides {
        addr: Some(format!("127.0.0.1:{port}")),
        data_dir: Some(data_dir),
        ..Default::default()
    };
    let mut config = match Config::load(None, &env, &flags) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    config.dev = true;
    eprintln!(
        "dev mode: auth OFF, bound to loopback only (127.0.0.1:{port}), data in {}\n\
         try it:\n  curl -s -X POST localhost:{port}/v1/topics -H 'Content-Type: application/json' -d '{{\"name\":\"orders\"}}'\n  \
         curl -s -X POST localhost:{port}/v1/topics/orders/produce -H 'Content-Type: application/json' -d '{{\"hello\":\"world\"}}'\n  \
         curl -s 'localhost:{port}/v1/topics/orders/consume?wait=5s'",
        config.data_dir.display()
    );
    run(config)
}

fn serve(args: ServeArgs) -> ExitCode {
    let flags = FlagOverrides {
        addr: args.addr,
        port: args.port,
        cluster_port: args.cluster_port,
        node_id: args.node_id,
        data_dir: args.data_dir,
        log_level: args.log_level,
        log_format: args.log_format,
        pprof_addr: args.pprof_addr,
    };
    let config = match Config::load(args.config.as_deref(), &env_map(), &flags) {
        Ok(c) => c,
        Err(e) => return fail(&e),
    };
    run(config)
}

fn run(config: Config) -> ExitCode {
    narad::logging::init(&config.log_level, &config.log_format);
    match narad::server::run(config) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

fn fail(msg: &str) -> ExitCode {
    eprintln!("narad: {msg}");
    ExitCode::from(2)
}
