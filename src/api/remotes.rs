//! The remote registry (API.md §14.1–14.5): remote clusters a parent topic may ship to,
//! replicated in Raft with their passwords sealed (`auth::seal`). Every route needs `admin` with
//! security on, answers `Cache-Control: no-store` (writes also `nosniff`), never contains a
//! password and writes one audit line. Writes are limited to 10 a minute per node; a create or a
//! password change needs the node to attest an encrypted ingress hop
//! (`remotes.api_hop_encrypted`). The test route and re-encryption are not here yet (`501`).

use std::rc::Rc;

use narad_raft::{MetaCommand, MetaResponse, RemoteLimits, RemoteMeta};
use serde_json::{json, Map, Value};

use super::children::REMOTES_NEED_SECURITY;
use super::params::Params;
use super::users::audited;
use super::{error, json as json_response};
use crate::auth::seal::{RemoteKey, SECRET_BYTES_MIN};
use crate::auth::Caller;
use crate::http::{Request, Response};
use crate::node::Node;
use crate::ship::guard::address_allowed;

/// Longest remote URL.
const URL_BYTES_MAX: usize = 2048;
/// Longest CA bundle, and certificates in it.
const CA_BYTES_MAX: usize = 64 << 10;
const CA_CERTS_MAX: usize = 16;
/// Writes per node per minute.
pub const WRITES_PER_MINUTE: usize = 10;

fn headers(mut r: Response, write: bool) -> Response {
    r.headers.push(("Cache-Control".into(), "no-store".into()));
    if write {
        r.headers
            .push(("X-Content-Type-Options".into(), "nosniff".into()));
    }
    r
}

/// Admin with security on, else the spec's `403`.
fn refused(node: &Node, c: &Caller) -> Option<Response> {
    (!node.config.security_enabled || !c.is_admin()).then(|| error(403, REMOTES_NEED_SECURITY))
}

fn key(node: &Node) -> Result<RemoteKey, Response> {
    RemoteKey::derive(node.config.cluster_secret.0.as_bytes()).ok_or_else(|| {
        error(
            412,
            &format!(
                "remotes need NARAD_CLUSTER_SECRET of at least {SECRET_BYTES_MIN} bytes: it derives the key that seals their passwords"
            ),
        )
    })
}

fn hop_attested(node: &Node) -> Result<(), Response> {
    if node.config.remotes.api_hop_encrypted {
        return Ok(());
    }
    Err(error(
        412,
        "this node does not attest an encrypted ingress hop (remotes.api_hop_encrypted): a remote's password must not reach it in the clear",
    ))
}

fn valid_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn valid_username(u: &str) -> bool {
    !u.is_empty()
        && u.len() <= 64
        && u.bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'_' | b'-'))
}

/// `https://host[:port][/path]` in canonical form (lowercase scheme and host, no default port,
/// no trailing dot), checked against `remotes.allowed_ports` and `remotes.allowed_hosts`.
pub fn canonical_url(
    url: &str,
    allowed_ports: &[u16],
    allowed_hosts: &[String],
) -> Result<String, String> {
    const SHAPE: &str = "invalid url: want https://host[:port][/path]";
    if url.len() > URL_BYTES_MAX {
        return Err(format!("invalid url: longer than {URL_BYTES_MAX} bytes"));
    }
    let rest = match url.get(..8) {
        Some(s) if s.eq_ignore_ascii_case("https://") => &url[8..],
        _ => return Err(SHAPE.into()),
    };
    if rest.contains(['?', '#', '@']) || rest.bytes().any(|b| b <= b' ' || b == 0x7f) {
        return Err("invalid url: no user, query or fragment".into());
    }
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) if !h.ends_with(']') || authority.starts_with('[') => {
            if p.is_empty() || p.len() > 5 || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err("invalid url: bad port".into());
            }
            let n: u32 = p.parse().map_err(|_| "invalid url: bad port".to_string())?;
            if n == 0 || n > 65535 {
                return Err("invalid url: bad port".into());
            }
            (h, n as u16)
        }
        _ => (authority, 443),
    };
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let host_ok = if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        inner.parse::<std::net::Ipv6Addr>().is_ok()
    } else {
        !host.is_empty()
            && host.len() <= 253
            && host.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                    && !l.starts_with('-')
                    && !l.ends_with('-')
            })
    };
    if !host_ok {
        return Err("invalid url: bad host".into());
    }
    if !allowed_ports.contains(&port) {
        return Err(format!(
            "invalid url: port {port} is not in remotes.allowed_ports"
        ));
    }
    if !allowed_hosts.is_empty()
        && !allowed_hosts.iter().any(|a| match a.strip_prefix("*.") {
            Some(suffix) => host.ends_with(&format!(".{}", suffix.to_ascii_lowercase())),
            None => host == a.to_ascii_lowercase(),
        })
    {
        return Err("invalid url: host is not in remotes.allowed_hosts".into());
    }
    let port_part = if port == 443 {
        String::new()
    } else {
        format!(":{port}")
    };
    let path = path.trim_end_matches('/');
    Ok(format!("https://{host}{port_part}{path}"))
}

/// Resolves the host of canonical `url` and checks every address against the guard.
async fn guard_url(node: &Node, url: &str) -> Result<(), Response> {
    let rest = &url["https://".len()..];
    let authority = rest.split('/').next().unwrap_or("");
    let host_port = if authority.ends_with(']') || !authority.contains(':') {
        format!("{authority}:443")
    } else {
        authority.to_string()
    };
    let addrs = narad_io::rt::resolve(&host_port)
        .await
        .map_err(|_| error(400, "invalid url: the host does not resolve from this node"))?;
    let allow = &node.config.remotes.allow_addresses;
    if addrs.is_empty() || addrs.iter().any(|a| !address_allowed(a.ip(), allow)) {
        return Err(error(
            400,
            "invalid url: the host resolves to a loopback, link-local or metadata address (allow it with remotes.allow_addresses)",
        ));
    }
    Ok(())
}

fn check_ca(pem: &str) -> Result<(), String> {
    let n = pem.matches("-----BEGIN CERTIFICATE-----").count();
    let ends = pem.matches("-----END CERTIFICATE-----").count();
    if pem.len() > CA_BYTES_MAX || n == 0 || n > CA_CERTS_MAX || n != ends {
        return Err(format!(
            "invalid ca_pem: 1 to {CA_CERTS_MAX} PEM certificates, at most {} KiB",
            CA_BYTES_MAX >> 10
        ));
    }
    Ok(())
}

fn default_limits() -> RemoteLimits {
    RemoteLimits {
        max_in_flight: 16,
        request_timeout_ms: 30_000,
        idle_conn_timeout_ms: 30_000,
        conn_max_age_ms: 300_000,
        check_interval_ms: 60_000,
        compression: "none".into(),
    }
}

/// Applies the named fields of a `limits` object over `l`.
fn apply_limits(l: &mut RemoteLimits, v: &Value) -> Result<(), String> {
    let Some(obj) = v.as_object() else {
        return Err("invalid limits: want an object".into());
    };
    for (k, v) in obj {
        let range = |lo: u64, hi: u64| -> Result<u64, String> {
            match v.as_u64() {
                Some(n) if (lo..=hi).contains(&n) => Ok(n),
                _ => Err(format!("invalid limits.{k}: want {lo} to {hi}")),
            }
        };
        match k.as_str() {
            "max_in_flight" => l.max_in_flight = range(1, 256)?,
            "request_timeout_ms" => l.request_timeout_ms = range(5_000, 120_000)?,
            "idle_conn_timeout_ms" => l.idle_conn_timeout_ms = range(1_000, 300_000)?,
            "conn_max_age_ms" => l.conn_max_age_ms = range(10_000, 3_600_000)?,
            "check_interval_ms" => l.check_interval_ms = range(10_000, 3_600_000)?,
            "compression" => match v.as_str() {
                Some(c @ ("none" | "zstd")) => l.compression = c.to_string(),
                _ => return Err("invalid limits.compression: want \"none\" or \"zstd\"".into()),
            },
            other => return Err(format!("invalid limits: unknown field {other:?}")),
        }
    }
    Ok(())
}

fn body_object(req: &Request) -> Result<Map<String, Value>, Response> {
    match serde_json::from_slice::<Value>(&req.body) {
        Ok(Value::Object(m)) => Ok(m),
        _ => Err(error(400, "invalid json: want an object")),
    }
}

const FIELDS: [&str; 6] = ["name", "url", "username", "password", "ca_pem", "limits"];

fn string_field<'a>(m: &'a Map<String, Value>, k: &str) -> Result<Option<&'a str>, Response> {
    match m.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(_) => Err(error(400, &format!("invalid {k}: want a string"))),
    }
}

fn unix_s(ms: u64) -> u64 {
    ms / 1000
}

fn sha512_hex(b: &[u8]) -> String {
    ring::digest::digest(&ring::digest::SHA512, b)
        .as_ref()
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// The Remote object (API.md §14.1): never the password, sealed or not.
fn view(r: &RemoteMeta) -> Value {
    let mut v = json!({
        "name": r.name,
        "id": r.id,
        "url": r.url,
        "username": r.username,
        "password": {
            "fingerprint": r.fingerprint,
            "set_at": unix_s(r.password_set_at_ms),
            "set_by": r.password_set_by,
            "key_version": r.key_version,
        },
        "credential_version": r.credential_version,
        "limits": {
            "max_in_flight": r.limits.max_in_flight,
            "request_timeout_ms": r.limits.request_timeout_ms,
            "idle_conn_timeout_ms": r.limits.idle_conn_timeout_ms,
            "conn_max_age_ms": r.limits.conn_max_age_ms,
            "check_interval_ms": r.limits.check_interval_ms,
            "compression": r.limits.compression,
        },
        "revision": r.revision,
        "created_at": unix_s(r.created_at_ms),
        "created_by": r.created_by,
    });
    if let Some(ca) = &r.ca_pem {
        v["ca_pem_sha512"] = json!(sha512_hex(ca.as_bytes()));
    }
    v
}

fn now_ms() -> u64 {
    narad_io::types::UnixMillis::now().0
}

fn answer(r: Result<MetaResponse, narad_raft::ProposeError>, status: u16) -> Response {
    match r {
        Ok(MetaResponse::Remote(r)) => json_response(status, &view(&r)),
        Ok(MetaResponse::Done) => Response::empty(204),
        Ok(other) => error(500, &format!("unexpected answer: {other:?}")),
        Err(e) => super::propose_error(e),
    }
}

/// The write budget of this node, or its `429`.
fn write_budget(node: &Node) -> Result<(), Response> {
    node.remote_write_slot(WRITES_PER_MINUTE)
        .map_err(|retry_s| {
            error(
                429,
                "too many remote registry writes on this node (10 a minute)",
            )
            .with_header("Retry-After", retry_s.to_string())
        })
}

/// `POST /v1/remotes` (§14.1).
pub async fn create(node: &Rc<Node>, req: &Request, c: &Caller) -> Response {
    let (name, r) = create_inner(node, req, c).await;
    audited("remote.create", c, &name, headers(r, true))
}

async fn create_inner(node: &Rc<Node>, req: &Request, c: &Caller) -> (String, Response) {
    if let Some(r) = refused(node, c) {
        return (String::new(), r);
    }
    let m = match body_object(req) {
        Ok(m) => m,
        Err(r) => return (String::new(), r),
    };
    let name = match string_field(&m, "name") {
        Ok(Some(n)) if valid_name(n) => n.to_string(),
        Ok(_) => {
            return (
                String::new(),
                error(
                    400,
                    "invalid name: a lowercase letter, then up to 62 of a-z, 0-9 and -",
                ),
            )
        }
        Err(r) => return (String::new(), r),
    };
    let out = async {
        if let Some(k) = m.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(error(400, &format!("unknown field {k:?}")));
        }
        let url = string_field(&m, "url")?.ok_or_else(|| error(400, "url required"))?;
        let url = canonical_url(
            url,
            &node.config.remotes.allowed_ports,
            &node.config.remotes.allowed_hosts,
        )
        .map_err(|e| error(400, &e))?;
        guard_url(node, &url).await?;
        let username = string_field(&m, "username")?.unwrap_or("");
        if !valid_username(username) {
            return Err(error(400, "invalid username: 1 to 64 of A-Z a-z 0-9 . _ -"));
        }
        let password = string_field(&m, "password")?.unwrap_or("");
        if !(24..=72).contains(&password.len()) {
            return Err(error(400, "invalid password: 24 to 72 bytes"));
        }
        let ca_pem = string_field(&m, "ca_pem")?.filter(|c| !c.is_empty());
        if let Some(ca) = ca_pem {
            check_ca(ca).map_err(|e| error(400, &e))?;
        }
        let mut limits = default_limits();
        if let Some(l) = m.get("limits").filter(|v| !v.is_null()) {
            apply_limits(&mut limits, l).map_err(|e| error(400, &e))?;
        }
        hop_attested(node)?;
        let key = key(node)?;
        write_budget(node)?;
        if node.meta().remotes.contains_key(&name) {
            return Err(error(409, &format!("remote {name:?} already exists")));
        }
        let mut id = [0u8; 8];
        narad_io::sys::fill_random(&mut id);
        let by = c.username().unwrap_or("-").to_string();
        let now = now_ms();
        let remote = RemoteMeta {
            name: name.clone(),
            id: id.iter().map(|b| format!("{b:02x}")).collect(),
            url,
            username: username.to_string(),
            sealed_password: key.seal(&name, password.as_bytes()),
            key_version: key.version().to_string(),
            fingerprint: key.fingerprint(password.as_bytes()),
            password_set_at_ms: now,
            password_set_by: by.clone(),
            credential_version: 1,
            ca_pem: ca_pem.map(str::to_string),
            limits,
            revision: 0,
            created_at_ms: now,
            created_by: by,
        };
        Ok(answer(
            node.propose(MetaCommand::CreateRemote(remote)).await,
            201,
        ))
    }
    .await;
    (name, out.unwrap_or_else(|r| r))
}

fn nodes_param(req: &Request) -> Result<bool, Response> {
    let q = Params::new(&req.query);
    match q.str("nodes")?.as_deref() {
        None | Some("true") | Some("1") => Ok(true),
        Some("false") | Some("0") => Ok(false),
        Some(_) => Err(error(400, "invalid nodes: want true or false")),
    }
}

/// `GET /v1/remotes` (§14.2).
pub async fn list(node: &Rc<Node>, req: &Request, c: &Caller) -> Response {
    let r = list_inner(node, req, c).await;
    audited("remote.list", c, "", headers(r, false))
}

/// Every other member's view of each credential (API.md §14.2), asked within 2 s: the
/// answers, and the members that did not answer (sorted).
async fn member_views(node: &Node) -> (Vec<Map<String, Value>>, Vec<String>) {
    let answers = node
        .ask_members(
            narad_io::peer::ops::REMOTE_VIEW,
            b"",
            std::time::Duration::from_secs(2),
        )
        .await;
    let mut views = Vec::new();
    let mut silent = Vec::new();
    for (id, a) in answers {
        match a
            .ok()
            .and_then(|b| serde_json::from_slice::<Map<String, Value>>(&b).ok())
        {
            Some(m) => views.push(m),
            None => silent.push(id),
        }
    }
    silent.sort();
    (views, silent)
}

/// The `nodes` of remote `r`: this node's row, then each other member's (`missing` where a
/// member's metadata does not have the remote yet).
fn node_rows(node: &Node, r: &RemoteMeta, others: &[Map<String, Value>]) -> Value {
    let mut rows = vec![crate::ship::node_view(node, r)];
    rows.extend(others.iter().map(|m| {
        m.get(&r.name)
            .cloned()
            .unwrap_or_else(|| json!({"node": Value::Null, "state": "missing"}))
    }));
    Value::Array(rows)
}

async fn list_inner(node: &Rc<Node>, req: &Request, c: &Caller) -> Response {
    if let Some(r) = refused(node, c) {
        return r;
    }
    let with_nodes = match nodes_param(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let meta = node.meta();
    let key = RemoteKey::derive(node.config.cluster_secret.0.as_bytes());
    let first = key.as_ref().and_then(|k| {
        meta.remotes
            .values()
            .filter(|r| r.key_version == k.version())
            .map(|r| r.password_set_at_ms)
            .min()
    });
    let (others, not_answering) = if with_nodes {
        member_views(node).await
    } else {
        (Vec::new(), Vec::new())
    };
    let remotes: Vec<Value> = meta
        .remotes
        .values()
        .map(|r| {
            let mut v = view(r);
            v["links"] = json!(links_of(&meta, &r.name));
            if with_nodes {
                let mut rows = vec![crate::ship::node_view(node, r)];
                rows.extend(others.iter().map(|m| {
                    m.get(&r.name)
                        .cloned()
                        .unwrap_or_else(|| json!({"node": Value::Null, "state": "missing"}))
                }));
                v["nodes"] = Value::Array(rows);
            }
            v
        })
        .collect();
    let mut out = json!({
        "allowlist": if node.config.remotes.allowed_hosts.is_empty() { "none" } else { "set" },
        "key": {
            "key_version": key.as_ref().map(|k| k.version().to_string()),
            "first_sealed_at": first.map(unix_s),
            "age_seconds": first.map(|f| now_ms().saturating_sub(f) / 1000),
        },
        "remotes": remotes,
    });
    if with_nodes {
        out["lingering"] = json!([]);
        out["not_answering"] = json!(not_answering);
    }
    json_response(200, &out)
}

/// `GET /v1/remotes/{name}` (§14.3).
pub async fn get(node: &Rc<Node>, req: &Request, c: &Caller, name: &str) -> Response {
    let r = get_inner(node, req, c, name).await;
    audited("remote.get", c, name, headers(r, false))
}

async fn get_inner(node: &Rc<Node>, req: &Request, c: &Caller, name: &str) -> Response {
    if let Some(r) = refused(node, c) {
        return r;
    }
    let with_nodes = match nodes_param(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !valid_name(name) {
        return error(
            400,
            "invalid name: a lowercase letter, then up to 62 of a-z, 0-9 and -",
        );
    }
    let Some(r) = node.meta().remotes.get(name).cloned() else {
        return error(404, &format!("remote {name:?} not found"));
    };
    let mut v = view(&r);
    if with_nodes {
        let (others, _) = member_views(node).await;
        v["nodes"] = node_rows(node, &r, &others);
    }
    json_response(200, &v)
}

/// `PATCH /v1/remotes/{name}` (§14.4).
pub async fn patch(node: &Rc<Node>, req: &Request, c: &Caller, name: &str) -> Response {
    let r = patch_inner(node, req, c, name).await;
    audited("remote.change", c, name, headers(r, true))
}

async fn patch_inner(node: &Rc<Node>, req: &Request, c: &Caller, name: &str) -> Response {
    if let Some(r) = refused(node, c) {
        return r;
    }
    let out = async {
        if !valid_name(name) {
            return Err(error(
                400,
                "invalid name: a lowercase letter, then up to 62 of a-z, 0-9 and -",
            ));
        }
        let m = body_object(req)?;
        if let Some(k) = m.keys().find(|k| !FIELDS[1..].contains(&k.as_str())) {
            return Err(error(400, &format!("unknown field {k:?}")));
        }
        let Some(cur) = node.meta().remotes.get(name).cloned() else {
            return Err(error(404, &format!("remote {name:?} not found")));
        };
        let mut next = cur.clone();
        let password = string_field(&m, "password")?;
        let mut credential = false;
        if let Some(u) = string_field(&m, "url")? {
            next.url = canonical_url(
                u,
                &node.config.remotes.allowed_ports,
                &node.config.remotes.allowed_hosts,
            )
            .map_err(|e| error(400, &e))?;
            guard_url(node, &next.url).await?;
            credential = true;
        }
        if let Some(u) = string_field(&m, "username")? {
            if !valid_username(u) {
                return Err(error(400, "invalid username: 1 to 64 of A-Z a-z 0-9 . _ -"));
            }
            next.username = u.to_string();
            credential = true;
        }
        if let Some(ca) = string_field(&m, "ca_pem")? {
            if ca.is_empty() {
                next.ca_pem = None;
            } else {
                check_ca(ca).map_err(|e| error(400, &e))?;
                next.ca_pem = Some(ca.to_string());
            }
            credential = true;
        }
        if let Some(l) = m.get("limits").filter(|v| !v.is_null()) {
            if l.as_object()
                .is_some_and(|o| o.values().any(|v| v == &json!(0) || v == &json!("")))
            {
                return Err(error(400, "invalid limits: 0 or \"\" is not a limit"));
            }
            apply_limits(&mut next.limits, l).map_err(|e| error(400, &e))?;
        }
        if credential && password.is_none() {
            return Err(error(
                400,
                "a new url, username or ca_pem needs password in the same request",
            ));
        }
        if let Some(p) = password {
            if !(24..=72).contains(&p.len()) {
                return Err(error(400, "invalid password: 24 to 72 bytes"));
            }
            hop_attested(node)?;
            let key = key(node)?;
            next.sealed_password = key.seal(name, p.as_bytes());
            next.key_version = key.version().to_string();
            next.fingerprint = key.fingerprint(p.as_bytes());
            next.password_set_at_ms = now_ms();
            next.password_set_by = c.username().unwrap_or("-").to_string();
            credential = true;
        }
        if credential {
            next.credential_version = cur.credential_version + 1;
        }
        write_budget(node)?;
        let cmd = MetaCommand::UpdateRemote {
            remote: next,
            base_revision: cur.revision,
        };
        Ok(answer(node.propose(cmd).await, 200))
    }
    .await;
    out.unwrap_or_else(|r| r)
}

/// `DELETE /v1/remotes/{name}` (§14.5). No remote child can use a remote yet, so `force` only
/// has to parse.
pub async fn delete(node: &Rc<Node>, req: &Request, c: &Caller, name: &str) -> Response {
    let r = delete_inner(node, req, c, name).await;
    audited("remote.delete", c, name, headers(r, true))
}

/// The remote children using remote `name`, as `"parent/child"`.
fn links_of(meta: &narad_raft::MetaState, name: &str) -> Vec<String> {
    meta.topics
        .values()
        .filter(|t| t.remote.as_ref().is_some_and(|r| r.name == name))
        .map(|t| format!("{}/{}", t.parent.as_deref().unwrap_or(""), t.name))
        .collect()
}

async fn delete_inner(node: &Rc<Node>, req: &Request, c: &Caller, name: &str) -> Response {
    if let Some(r) = refused(node, c) {
        return r;
    }
    let q = Params::new(&req.query);
    match q.str("force") {
        Ok(None) => {}
        Ok(Some(v)) if matches!(v.as_str(), "true" | "false" | "1" | "0") => {}
        Ok(Some(_)) => return error(400, "invalid force: want true or false"),
        Err(r) => return r,
    }
    if !valid_name(name) {
        return error(
            400,
            "invalid name: a lowercase letter, then up to 62 of a-z, 0-9 and -",
        );
    }
    let meta = node.meta();
    if !meta.remotes.contains_key(name) {
        return error(404, &format!("remote {name:?} not found"));
    }
    // §14.5: refused while remote children use it, unless forced (they then hold in
    // `remote_missing`).
    let links = links_of(&meta, name);
    let force = matches!(q.str("force"), Ok(Some(v)) if v == "true" || v == "1");
    if !links.is_empty() && !force {
        return json_response(
            409,
            &json!({
                "error": format!("remote is used by {} remote children", links.len()),
                "links": links,
            }),
        );
    }
    if let Err(r) = write_budget(node) {
        return r;
    }
    let cmd = MetaCommand::DeleteRemote {
        name: name.to_string(),
    };
    answer(node.propose(cmd).await, 204)
}

/// `POST /v1/cluster/reencrypt-remotes` (§14.7): after a rotation of the cluster secret, every
/// password sealed under the previous secret's key (`NARAD_CLUSTER_SECRET_PREVIOUS`) is opened
/// and sealed again under the current one, one compare-and-swap per remote.
/// `POST /v1/remotes/{name}/test` (§14.6): the checks of an attach against `topic` on the
/// remote, from this node; `200` whenever they ran, pass or fail.
pub async fn test(node: &Rc<Node>, req: &Request, c: &Caller, name: &str) -> Response {
    let r = test_inner(node, req, c, name).await;
    audited("remote.test", c, name, headers(r, true))
}

async fn test_inner(node: &Rc<Node>, req: &Request, c: &Caller, name: &str) -> Response {
    if let Some(r) = refused(node, c) {
        return r;
    }
    let body = match body_object(req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let Some(topic) = body.get("topic").and_then(Value::as_str) else {
        return error(400, "topic is required");
    };
    let source = match body.get("source") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.as_str()),
        Some(_) => return error(400, "invalid source: want a topic name"),
    };
    let meta = node.meta();
    let Some(remote) = meta.remotes.get(name).cloned() else {
        return error(404, &format!("remote {name:?} not found"));
    };
    let source = match source {
        Some(s) => match meta.topic(s) {
            Some(t) => Some(t.clone()),
            None => return error(404, "topic not found"),
        },
        None => None,
    };
    if let Err(retry_s) = node.remote_check_slot(name) {
        return error(429, "this remote was checked less than 5 s ago")
            .with_header("Retry-After", retry_s.to_string());
    }
    let started = std::time::Instant::now();
    let (outcome, mut checks) = Box::pin(crate::ship::probe_everywhere(node, &remote, topic)).await;
    let rtt_ms = started.elapsed().as_millis() as u64;
    let (result, class, _target_id, detail) = match outcome {
        Ok(info) => {
            let mine = source.as_ref().and_then(|t| t.current_schema());
            match (mine, info.schema.as_ref()) {
                (Some(a), Some(b)) if a != b => (
                    "fail",
                    "rejected_record",
                    info.id,
                    "the target topic's schema differs from the source's".to_string(),
                ),
                _ => ("pass", "", info.id, String::new()),
            }
        }
        Err(f) => ("fail", f.class.as_str(), String::new(), f.detail),
    };
    let cfg = &node.config;
    for row in &mut checks {
        row["credential_version"] = json!(remote.credential_version);
        row["warnings"] = json!([]);
    }
    // This node's row (the first) says its own posture and how long the checks took.
    if let Some(mine) = checks.first_mut() {
        mine["rtt_ms"] = json!(rtt_ms);
        mine["posture"] = json!({
            "security_enabled": cfg.security_enabled,
            "legacy_cluster_auth": false,
            "raft_tls": !cfg.cluster_tls.cert_file.is_empty(),
            "api_hop_encrypted": cfg.remotes.api_hop_encrypted,
        });
        if result == "fail" && mine["result"] == "pass" && !detail.is_empty() {
            mine["result"] = json!("fail");
            mine["class"] = json!(class);
            mine["detail"] = json!(detail);
        }
    }
    json_response(
        200,
        &json!({
            "remote": name,
            "result": result,
            "class": class,
            "checks": checks,
        }),
    )
}

pub async fn reencrypt(node: &Rc<Node>, req: &Request, c: &Caller) -> Response {
    let r = reencrypt_inner(node, req, c).await;
    audited("remote.reencrypt", c, "", headers(r, true))
}

async fn reencrypt_inner(node: &Rc<Node>, req: &Request, c: &Caller) -> Response {
    if let Some(r) = refused(node, c) {
        return r;
    }
    let empty = req.body.iter().all(u8::is_ascii_whitespace);
    if !empty
        && !matches!(serde_json::from_slice::<Value>(&req.body), Ok(Value::Object(m)) if m.is_empty())
    {
        return error(400, "the body must be empty or {}");
    }
    let key = match key(node) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let previous = RemoteKey::derive(node.config.cluster_secret_previous.0.as_bytes());
    if let Err(r) = write_budget(node) {
        return r;
    }
    let (mut done, mut current, mut failed) = (Vec::new(), Vec::new(), Vec::new());
    let remotes: Vec<RemoteMeta> = node.meta().remotes.values().cloned().collect();
    for r in remotes {
        if r.key_version == key.version() {
            current.push(r.name.clone());
            continue;
        }
        let Some(prev) = previous.as_ref().filter(|p| p.version() == r.key_version) else {
            failed.push(json!({"name": r.name, "reason": "key_unknown"}));
            continue;
        };
        let Ok(password) = prev.open(&r.name, &r.key_version, &r.sealed_password) else {
            failed.push(json!({"name": r.name, "reason": "open_failed"}));
            continue;
        };
        let mut next = r.clone();
        next.sealed_password = key.seal(&r.name, &password);
        next.key_version = key.version().to_string();
        next.fingerprint = key.fingerprint(&password);
        let cmd = MetaCommand::UpdateRemote {
            remote: next,
            base_revision: r.revision,
        };
        match node.propose(cmd).await {
            Ok(_) => done.push(r.name.clone()),
            Err(e) => failed
                .push(json!({"name": r.name, "reason": "write_failed", "error": e.to_string()})),
        }
    }
    json_response(
        200,
        &json!({
            "key_version": key.version(),
            "reencrypted": done,
            "already_current": current,
            "failed": failed,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_made_canonical() {
        let ports = [443u16, 8443];
        let ok = |u: &str| canonical_url(u, &ports, &[]);
        assert_eq!(
            ok("HTTPS://Narad.Example.COM./").unwrap(),
            "https://narad.example.com"
        );
        assert_eq!(
            ok("https://b.example:443/api/").unwrap(),
            "https://b.example/api"
        );
        assert_eq!(
            ok("https://b.example:8443").unwrap(),
            "https://b.example:8443"
        );
        assert_eq!(ok("https://[::1]:8443").unwrap(), "https://[::1]:8443");
        for bad in [
            "http://b.example",
            "https://user@b.example",
            "https://b.example/?q=1",
            "https://b.example/#f",
            "https://b.example:0",
            "https://b.example:99999",
            "https://-b.example",
            "https://",
            "ftp://b.example",
        ] {
            assert!(ok(bad).is_err(), "{bad}");
        }
        let e = ok("https://b.example:9000").unwrap_err();
        assert!(e.contains("remotes.allowed_ports"), "{e}");
        let hosts = vec!["*.example.com".to_string(), "c.test".to_string()];
        assert!(canonical_url("https://a.example.com", &ports, &hosts).is_ok());
        assert!(canonical_url("https://c.test", &ports, &hosts).is_ok());
        assert!(canonical_url("https://example.com.evil", &ports, &hosts).is_err());
        assert!(canonical_url(&format!("https://a.b/{}", "x".repeat(2048)), &ports, &[]).is_err());
    }

    #[test]
    fn names_usernames_limits_and_bundles() {
        assert!(valid_name("b") && valid_name("dr-eu-1"));
        assert!(!valid_name("B") && !valid_name("1b") && !valid_name(&"b".repeat(64)));
        assert!(valid_username("replicator.eu_1-a") && !valid_username("a b"));
        let mut l = default_limits();
        apply_limits(&mut l, &json!({"max_in_flight": 32, "compression": "zstd"})).unwrap();
        assert_eq!((l.max_in_flight, l.compression.as_str()), (32, "zstd"));
        assert!(apply_limits(&mut l, &json!({"max_in_flight": 0})).is_err());
        assert!(apply_limits(&mut l, &json!({"request_timeout_ms": 200000})).is_err());
        assert!(apply_limits(&mut l, &json!({"nope": 1})).is_err());
        let cert = "-----BEGIN CERTIFICATE-----\nAA==\n-----END CERTIFICATE-----\n";
        assert!(check_ca(cert).is_ok());
        assert!(check_ca("").is_err());
        assert!(check_ca(&cert.repeat(17)).is_err());
    }
}
