//! `narad cluster members|moves|decommission` (OPERATIONS.md §1.1, API.md §12): cluster
//! administration over `/v1/cluster`. Prints the server's JSON; a server without these routes is
//! reported by `super::call` as a missing feature (exit 1). Never changes membership without the
//! operator naming the node.

use clap::Subcommand;

use super::client::{escape, Client};
use super::{call, print_pretty, CliError};

#[derive(Subcommand, Debug)]
pub enum ClusterCommand {
    /// List members (JSON).
    Members {
        /// Also ask every member for its own status.
        #[arg(long)]
        detail: bool,
        #[command(subcommand)]
        command: Option<MembersCommand>,
    },
    /// List partition moves in flight (JSON).
    Moves {
        /// Also show each move's worker.
        #[arg(long)]
        detail: bool,
        #[command(subcommand)]
        command: Option<MovesCommand>,
    },
    /// Drain a member so it can leave (or --cancel; --dry-run only checks).
    Decommission {
        node_id: String,
        /// Stop draining the member.
        #[arg(long, conflicts_with = "dry_run")]
        cancel: bool,
        /// Report whether the decommission could proceed; change nothing (JSON).
        #[arg(long = "dry-run")]
        dry_run: bool,
    },
}

#[derive(Subcommand, Debug)]
pub enum MembersCommand {
    /// Remove a Raft server that has no member record (prints JSON).
    Forget { node_id: String },
}

#[derive(Subcommand, Debug)]
pub enum MovesCommand {
    /// Abort a partition move in flight (prints JSON).
    Abort {
        topic: String,
        partition: u32,
        /// Refuse unless the move still targets this node.
        #[arg(long)]
        target: Option<String>,
    },
}

fn member_path(id: &str, rest: &str) -> String {
    format!("/v1/cluster/members/{}{rest}", escape(id))
}

pub fn run(client: &mut Client, cmd: ClusterCommand) -> Result<(), CliError> {
    match cmd {
        ClusterCommand::Members {
            command: Some(MembersCommand::Forget { node_id }),
            ..
        } => {
            let r = call(client, "POST", &member_path(&node_id, "/forget"), None)?;
            print_pretty(&r)
        }
        ClusterCommand::Members {
            detail,
            command: None,
        } => {
            let path = if detail {
                "/v1/cluster/members?detail=true"
            } else {
                "/v1/cluster/members"
            };
            print_pretty(&call(client, "GET", path, None)?)
        }
        ClusterCommand::Moves {
            command:
                Some(MovesCommand::Abort {
                    topic,
                    partition,
                    target,
                }),
            ..
        } => {
            let mut path = format!("/v1/cluster/moves/{}/{partition}/abort", escape(&topic));
            if let Some(t) = target {
                path.push_str(&format!("?target={}", escape(&t)));
            }
            print_pretty(&call(client, "POST", &path, None)?)
        }
        ClusterCommand::Moves {
            detail,
            command: None,
        } => {
            let path = if detail {
                "/v1/cluster/moves?detail=true"
            } else {
                "/v1/cluster/moves"
            };
            print_pretty(&call(client, "GET", path, None)?)
        }
        ClusterCommand::Decommission {
            node_id,
            cancel,
            dry_run,
        } => {
            if dry_run {
                let path = member_path(&node_id, "/decommission?dry_run=true");
                return print_pretty(&call(client, "POST", &path, None)?);
            }
            let path = member_path(&node_id, "/decommission");
            if cancel {
                call(client, "DELETE", &path, None)?;
                eprintln!("decommission of \"{node_id}\" cancelled");
            } else {
                call(client, "POST", &path, None)?;
                eprintln!(
                    "\"{node_id}\" is draining; follow it with `narad cluster members` and \
                     `narad cluster moves`"
                );
            }
            Ok(())
        }
    }
}
