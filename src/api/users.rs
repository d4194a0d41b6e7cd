//! User routes (API.md §11, §13): create, list, get, delete, replace grants, change password,
//! with the no-escalation and root-admin rules of SEMANTICS.md §15 and an audit line for every
//! change. Password hashing runs on the bcrypt helper threads (`crate::auth`); writes go
//! through Raft. Never serialises a password or a hash, never logs one.

use std::rc::Rc;

use narad_raft::{Grant, MetaCommand, MetaResponse, UserMeta};
use serde::{Deserialize, Serialize};

use super::{error, json, propose_error};
use crate::auth::{self, rbac, Caller};
use crate::http::{Request, Response};
use crate::node::Node;

pub const ADMIN_REQUIRED: &str = "admin privileges required";
const ESCALATION: &str = "cannot grant permissions you do not hold";

/// The User object of API.md §13.1.
#[derive(Serialize)]
pub struct UserView<'a> {
    username: &'a str,
    #[serde(skip_serializing_if = "<[Grant]>::is_empty")]
    grants: &'a [Grant],
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    root: bool,
    #[serde(skip_serializing_if = "is_zero")]
    created_at_ms: u64,
    #[serde(skip_serializing_if = "is_zero")]
    updated_at_ms: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

pub fn view(u: &UserMeta) -> UserView<'_> {
    UserView {
        username: &u.username,
        grants: &u.grants,
        root: u.root,
        created_at_ms: u.created_at_ms,
        updated_at_ms: u.updated_at_ms,
    }
}

/// A grant as a request carries it: a JSON object only (serde's positional array form is
/// refused, as Go's decoder does), unknown fields refused, keys matched as Go matches them, and
/// `"patterns": null` read as no patterns (what Go's encoder writes for a nil slice).
struct GrantBody {
    action: String,
    patterns: Vec<String>,
}

impl<'de> Deserialize<'de> for GrantBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<GrantBody, D::Error> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Fields {
            action: String,
            #[serde(default)]
            patterns: Option<Vec<String>>,
        }
        struct ObjectOnly;
        impl<'de> serde::de::Visitor<'de> for ObjectOnly {
            type Value = GrantBody;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a grant object")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                map: A,
            ) -> Result<GrantBody, A::Error> {
                let f = Fields::deserialize(serde::de::value::MapAccessDeserializer::new(map))?;
                Ok(GrantBody {
                    action: f.action,
                    patterns: f.patterns.unwrap_or_default(),
                })
            }
        }
        // As a struct, so that keys match its fields as Go matches them (`wire::gokeys`).
        d.deserialize_struct("grant", &["action", "patterns"], ObjectOnly)
    }
}

fn grants_of(g: Option<Vec<GrantBody>>) -> Vec<Grant> {
    g.unwrap_or_default()
        .into_iter()
        .map(|g| Grant {
            action: g.action,
            patterns: g.patterns,
        })
        .collect()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis() as u64
}

fn actor(c: &Caller) -> &str {
    c.username().unwrap_or("-")
}

fn password_ok(p: &str) -> bool {
    !p.is_empty() && p.len() <= auth::PASSWORD_BYTES_MAX
}

/// Audits the outcome of a change and passes the answer through.
pub(crate) fn audited(event: &str, c: &Caller, target: &str, r: Response) -> Response {
    let outcome = match r.status {
        200..=299 => "ok",
        403 => "denied",
        400..=499 => "rejected",
        _ => "failed",
    };
    auth::audit(event, actor(c), target, r.status, outcome);
    r
}

fn user_answer(r: Result<MetaResponse, narad_raft::ProposeError>, status: u16) -> Response {
    match r {
        Ok(MetaResponse::User(u)) => json(status, &view(&u)),
        Ok(_) => error(500, "unexpected metadata answer"),
        Err(e) => propose_error(e),
    }
}

fn bad(e: narad_raft::MetaError) -> Response {
    super::meta_refusal(&e)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    grants: Option<Vec<GrantBody>>,
}

/// `POST /v1/users`
pub async fn create(node: &Rc<Node>, req: &Request, c: &Caller) -> Response {
    let resp = match create_inner(node, req, c).await {
        Ok(target) => {
            let resp = match node.meta().user(&target) {
                Some(u) => json(201, &view(u)),
                None => error(503, "user create was applied but is not visible yet; retry"),
            };
            return audited("user.create", c, &target, resp);
        }
        Err((target, resp)) => (target, resp),
    };
    audited("user.create", c, &resp.0, resp.1)
}

/// Creates the user; `Ok(username)` once applied, or the username (if known) and the refusal.
async fn create_inner(
    node: &Rc<Node>,
    req: &Request,
    c: &Caller,
) -> Result<String, (String, Response)> {
    if !c.is_admin() {
        return Err((String::new(), error(403, ADMIN_REQUIRED)));
    }
    let body: CreateBody = crate::wire::body::decode_strict(&req.body, "createUserRequest")
        .map_err(|e| (String::new(), error(400, &e)))?;
    let username = body.username.unwrap_or_default();
    let fail = |r: Response| (username.clone(), r);
    narad_raft::apply::validate_username(&username).map_err(|e| fail(bad(e)))?;
    let password = body.password.unwrap_or_default();
    if !password_ok(&password) {
        return Err(fail(error(400, "password required")));
    }
    let grants = grants_of(body.grants);
    narad_raft::apply::validate_grants(&grants).map_err(|e| fail(bad(e)))?;
    if let Some(u) = c.user() {
        if !rbac::may_give(u, &grants) {
            return Err(fail(error(403, ESCALATION)));
        }
    }
    if node.meta().user(&username).is_some() {
        return Err(fail(error(409, "user already exists")));
    }
    let hash = auth::node_auth()
        .hash_password(password.into_bytes())
        .await
        .map_err(|e| fail(e.into()))?;
    let now = now_ms();
    let cmd = MetaCommand::CreateUser(UserMeta {
        username: username.clone(),
        password_hash: hash,
        grants,
        root: false,
        created_at_ms: now,
        updated_at_ms: now,
    });
    match node.propose(cmd).await {
        Ok(_) => Ok(username),
        Err(e) => Err(fail(propose_error(e))),
    }
}

/// `GET /v1/users`
pub fn list(node: &Rc<Node>, c: &Caller) -> Response {
    if !c.is_admin() {
        return error(403, ADMIN_REQUIRED);
    }
    let meta = node.meta();
    let users: Vec<UserView<'_>> = meta.users.values().map(view).collect();
    json(200, &users)
}

/// `GET /v1/users/{username}`
pub fn get(node: &Rc<Node>, c: &Caller, username: &str) -> Response {
    if !c.is_admin() {
        return error(403, ADMIN_REQUIRED);
    }
    match node.meta().user(username) {
        Some(u) => json(200, &view(u)),
        None => error(404, "user not found"),
    }
}

/// `DELETE /v1/users/{username}`
pub async fn delete(node: &Rc<Node>, c: &Caller, username: &str) -> Response {
    let resp = delete_inner(node, c, username).await;
    audited("user.delete", c, username, resp)
}

async fn delete_inner(node: &Rc<Node>, c: &Caller, username: &str) -> Response {
    if !c.is_admin() {
        return error(403, ADMIN_REQUIRED);
    }
    let Some(target) = node.meta().user(username).cloned() else {
        return error(404, "user not found");
    };
    if target.root {
        return error(403, "the root admin cannot be deleted");
    }
    if c.username() == Some(username) {
        return error(403, "cannot delete your own account");
    }
    match node
        .propose(MetaCommand::DeleteUser {
            username: username.to_string(),
        })
        .await
    {
        Ok(_) => Response::empty(204),
        Err(e) => propose_error(e),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsBody {
    grants: Option<Vec<GrantBody>>,
}

/// `PUT /v1/users/{username}/grants`
pub async fn set_grants(node: &Rc<Node>, req: &Request, c: &Caller, username: &str) -> Response {
    let resp = set_grants_inner(node, req, c, username).await;
    audited("user.grants", c, username, resp)
}

async fn set_grants_inner(node: &Rc<Node>, req: &Request, c: &Caller, username: &str) -> Response {
    if !c.is_admin() {
        return error(403, ADMIN_REQUIRED);
    }
    let body: GrantsBody =
        tri!(crate::wire::body::decode_strict(&req.body, "grantsRequest")
            .map_err(|e| error(400, &e)));
    let Some(grants) = body.grants else {
        return error(400, "grants required");
    };
    let grants = grants_of(Some(grants));
    let Some(target) = node.meta().user(username).cloned() else {
        return error(404, "user not found");
    };
    if c.username() == Some(username) {
        return error(403, "cannot modify your own grants");
    }
    if target.root {
        return error(403, "the root admin's grants are immutable");
    }
    if let Err(e) = narad_raft::apply::validate_grants(&grants) {
        return bad(e);
    }
    if let Some(u) = c.user() {
        if !rbac::may_give(u, &grants) {
            return error(403, ESCALATION);
        }
    }
    let cmd = MetaCommand::SetGrants {
        username: username.to_string(),
        grants,
        updated_at_ms: now_ms(),
    };
    user_answer(node.propose(cmd).await, 200)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PasswordBody {
    #[serde(default)]
    new_password: Option<String>,
    #[serde(default)]
    current_password: Option<String>,
}

/// `PUT /v1/users/{username}/password`
pub async fn set_password(node: &Rc<Node>, req: &Request, c: &Caller, username: &str) -> Response {
    let resp = set_password_inner(node, req, c, username).await;
    audited("user.password", c, username, resp)
}

async fn set_password_inner(
    node: &Rc<Node>,
    req: &Request,
    c: &Caller,
    username: &str,
) -> Response {
    let own = c.username() == Some(username);
    let admin = c.is_admin();
    if !admin && !own {
        return error(403, ADMIN_REQUIRED);
    }
    let body: PasswordBody = tri!(
        crate::wire::body::decode_strict(&req.body, "passwordRequest").map_err(|e| error(400, &e))
    );
    let Some(target) = node.meta().user(username).cloned() else {
        return error(404, "user not found");
    };
    if target.root && !own && !c.open() {
        return error(403, "only the root admin may change the root password");
    }
    let new = body.new_password.unwrap_or_default();
    if !password_ok(&new) {
        return error(400, "new_password required");
    }
    if !admin {
        let current = body.current_password.unwrap_or_default();
        let ok = !current.is_empty()
            && current.len() <= auth::PASSWORD_BYTES_MAX
            && tri!(
                auth::node_auth()
                    .verify_password(current.into_bytes(), target.password_hash.clone())
                    .await
            );
        if !ok {
            return error(403, "current password is incorrect");
        }
    }
    let hash = tri!(auth::node_auth().hash_password(new.into_bytes()).await);
    let cmd = MetaCommand::SetPassword {
        username: username.to_string(),
        password_hash: hash,
        updated_at_ms: now_ms(),
    };
    match node.propose(cmd).await {
        Ok(_) => Response::empty(204),
        Err(e) => propose_error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grants(json: &str) -> Result<Vec<(String, Vec<String>)>, String> {
        crate::wire::body::decode_strict::<GrantsBody>(json.as_bytes(), "grantsRequest").map(|b| {
            b.grants
                .unwrap_or_default()
                .into_iter()
                .map(|g| (g.action, g.patterns))
                .collect()
        })
    }

    #[test]
    fn grant_elements_are_objects_and_null_patterns_are_none() {
        // Proves a grant element must be an object (no positional array form), unknown fields
        // are refused, and `"patterns": null` or absent means no patterns, as Go reads them.
        assert_eq!(
            grants(r#"{"grants":[{"action":"admin","patterns":null},{"action":"admin"}]}"#),
            Ok(vec![("admin".into(), vec![]), ("admin".into(), vec![])])
        );
        assert_eq!(
            grants(r#"{"grants":[{"action":"produce","patterns":["a*"]}]}"#),
            Ok(vec![("produce".into(), vec!["a*".into()])])
        );
        let e = grants(r#"{"grants":[["produce",["a*"]]]}"#).unwrap_err();
        assert!(e.starts_with("invalid json:"), "{e}");
        let e = grants(r#"{"grants":[{"action":"produce","x":1}]}"#).unwrap_err();
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn grant_keys_match_as_go_matches_them() {
        // Proves keys of the body and of each grant match without regard to letter case, and a
        // repeated key takes its last value, at both levels.
        assert_eq!(
            grants(r#"{"Grants":[{"ACTION":"produce","Patterns":["a*"],"patterns":["b*"]}]}"#),
            Ok(vec![("produce".into(), vec!["b*".into()])])
        );
        assert_eq!(
            grants(r#"{"grants":[],"GRANTS":[{"Action":"consume"}]}"#),
            Ok(vec![("consume".into(), vec![])])
        );
    }
}
