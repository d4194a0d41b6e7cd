//! `narad user add|grant|ls|rm` (OPERATIONS.md §1.1, API.md §11, §13): user administration over
//! `/v1/users`. Owns the `--grant action:pattern[,pattern]` syntax. Never prints or logs a
//! password, and never reads one from anywhere but a flag or the first line of stdin.

use clap::Subcommand;
use serde::Serialize;
use serde_json::json;

use super::client::{escape, Client};
use super::{call, print_pretty, read_secret_line, CliError};

/// `--grant` flags per command at most (every action with many patterns fits).
pub const GRANTS_MAX: usize = 64;

#[derive(Subcommand, Debug)]
pub enum UserCommand {
    /// Create a user (prints the user, JSON).
    Add {
        username: String,
        /// The new user's password.
        #[arg(
            long = "user-password",
            value_name = "P",
            required_unless_present = "user_password_stdin"
        )]
        user_password: Option<String>,
        /// Read the new user's password from a line of stdin.
        #[arg(long = "user-password-stdin", conflicts_with = "user_password")]
        user_password_stdin: bool,
        /// A grant: `produce|consume|create:PATTERN[,PATTERN]...` or `admin`; repeatable.
        #[arg(long = "grant", value_name = "ACTION:PATTERNS")]
        grants: Vec<String>,
    },
    /// Replace a user's grants with the given ones (none: remove all); prints the user, JSON.
    Grant {
        username: String,
        /// A grant: `produce|consume|create:PATTERN[,PATTERN]...` or `admin`; repeatable.
        #[arg(long = "grant", value_name = "ACTION:PATTERNS")]
        grants: Vec<String>,
    },
    /// List users (JSON array).
    Ls,
    /// Delete a user.
    Rm { username: String },
}

/// A Grant object (API.md §13.2).
#[derive(Serialize, Debug, PartialEq, Eq)]
pub struct Grant {
    pub action: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub patterns: Vec<String>,
}

/// Parses `action:pattern[,pattern]` (or a bare action such as `admin`). Whether the action and
/// patterns are acceptable is the server's call; only the shape is checked here.
pub fn parse_grant(s: &str) -> Result<Grant, String> {
    let (action, patterns) = match s.split_once(':') {
        Some((a, p)) => (a, p),
        None => (s, ""),
    };
    let action = action.trim();
    if action.is_empty() {
        return Err(format!(
            "--grant {s:?}: want ACTION:PATTERN[,PATTERN] or admin"
        ));
    }
    let patterns: Vec<String> = patterns
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    Ok(Grant {
        action: action.to_string(),
        patterns,
    })
}

fn grants(flags: &[String]) -> Result<Vec<Grant>, CliError> {
    if flags.len() > GRANTS_MAX {
        return Err(CliError::Usage(format!(
            "at most {GRANTS_MAX} --grant flags"
        )));
    }
    flags
        .iter()
        .map(|g| parse_grant(g).map_err(CliError::Usage))
        .collect()
}

fn user_path(name: &str) -> String {
    format!("/v1/users/{}", escape(name))
}

pub fn run(client: &mut Client, cmd: UserCommand) -> Result<(), CliError> {
    match cmd {
        UserCommand::Add {
            username,
            user_password,
            user_password_stdin,
            grants: flags,
        } => {
            let grants = grants(&flags)?;
            let password = match user_password {
                Some(p) => p,
                None if user_password_stdin => read_secret_line("--user-password-stdin")?,
                None => {
                    return Err(CliError::Usage(
                        "user add: give --user-password or --user-password-stdin".into(),
                    ))
                }
            };
            let mut body = json!({"username": username, "password": password});
            if !grants.is_empty() {
                body["grants"] = json!(grants);
            }
            let r = call(client, "POST", "/v1/users", Some(&body))?;
            print_pretty(&r)
        }
        UserCommand::Grant {
            username,
            grants: flags,
        } => {
            let body = json!({ "grants": grants(&flags)? });
            let r = call(
                client,
                "PUT",
                &format!("{}/grants", user_path(&username)),
                Some(&body),
            )?;
            print_pretty(&r)
        }
        UserCommand::Ls => {
            let r = call(client, "GET", "/v1/users", None)?;
            print_pretty(&r)
        }
        UserCommand::Rm { username } => {
            call(client, "DELETE", &user_path(&username), None)?;
            eprintln!("deleted user \"{username}\"");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grant_syntax() {
        assert_eq!(
            parse_grant("produce:invoices.*,orders").unwrap(),
            Grant {
                action: "produce".into(),
                patterns: vec!["invoices.*".into(), "orders".into()]
            }
        );
        let admin = parse_grant("admin").unwrap();
        assert_eq!(
            serde_json::to_string(&admin).unwrap(),
            r#"{"action":"admin"}"#
        );
        assert_eq!(
            parse_grant("consume:").unwrap().patterns,
            Vec::<String>::new()
        );
        assert!(parse_grant(":x").is_err());
        assert!(parse_grant("").is_err());
    }
}
