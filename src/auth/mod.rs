//! Authentication and the node-wide security state (API.md §2, SEMANTICS.md §15).
//!
//! Owns: HTTP Basic parsing, the credential caches, the failed-login throttle, the bcrypt helper
//! threads ([`verify`]), per-identity caps ([`caps`]), grant checks ([`rbac`]) and root seeding
//! ([`seed`]). Users and their bcrypt hashes live in the Raft metadata; this module only reads
//! them from the shard's metadata copy. It never logs, stores or returns a password: inputs
//! are kept only as a 128-bit keyed tag (two SipHash keys drawn at process start), compared
//! against the user's current hash, so a password or grant change takes effect on the next
//! request (a cached verification is valid only while the user's stored hash is unchanged;
//! grants are read from the current metadata on every request).
//!
//! Where state lives: a shard-local positive cache answers repeat requests without any lock;
//! on a miss, the node-wide [`NodeAuth`] (one per process, behind a mutex held for map updates
//! only) has the node's positive and negative caches, the throttle and the checks in flight;
//! the bcrypt work itself runs on helper threads and the shard task awaits a [`verify::Slot`].
//!
//! The pipeline calls [`precheck`] from the head alone (before the body is read): it answers
//! everything it can from caches (`401`, pass, open). Only a credential this node has not yet
//! judged needs a bcrypt check; then the body is read first and [`authenticate`] awaits the check
//! before the guard and route are decided, so the order of API.md §1.4 still holds.

pub mod caps;
pub mod rbac;
pub mod seal;
pub mod seed;
pub mod throttle;
pub mod verify;

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::rc::{Rc, Weak};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use narad_raft::{MetaState, TopicMeta, UserMeta};

use crate::http::Headers;
use crate::node::Node;

/// How long a wrong password gets an instant `401` without a new check (API.md §2).
pub const NEGATIVE_TTL: Duration = Duration::from_secs(60);
/// Entries of the node's positive cache; past it the cache starts over.
pub const NODE_OK_CACHE_MAX: usize = 16_384;
/// Entries of the node's negative cache; past it expired entries go, then all.
pub const NODE_BAD_CACHE_MAX: usize = 16_384;
/// Entries of each shard's positive cache.
pub const SHARD_OK_CACHE_MAX: usize = 4096;
pub use crate::config::PASSWORD_BYTES_MAX;
/// Longest `Authorization` header value looked at.
const AUTH_HEADER_BYTES_MAX: usize = 1024;

/// Why a request was not authenticated, or a password not hashed or checked. The API layer
/// answers each (`401` with the Basic challenge, `429`, `503` + `Retry-After`, `500`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthError {
    /// No usable credential, an unknown user or a wrong password (API.md §2).
    Unauthorized,
    /// Too many failed attempts for this username lately.
    Throttled,
    /// The bcrypt queue is full: refused at once, retry.
    Busy,
    /// The check could not be run (a stored hash unusable, a helper thread lost).
    Unavailable,
    /// Hashing a new password failed.
    HashFailed,
}

impl std::fmt::Display for AuthError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            AuthError::Unauthorized => "authentication required",
            AuthError::Throttled => "too many failed authentication attempts",
            AuthError::Busy => "authentication busy; retry later",
            AuthError::Unavailable => "authentication unavailable",
            AuthError::HashFailed => "hashing the password failed",
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

/// A 128-bit keyed tag of (username, password): what the caches keep instead of the password.
type Tag = u128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Outcome {
    Ok,
    Bad,
    Unavailable,
}

struct AuthState {
    /// Verified credentials: tag → (username, the hash they verified against).
    ok: HashMap<Tag, (String, String)>,
    /// Wrong passwords: tag → (hash they failed against, when).
    bad: HashMap<Tag, (String, Instant)>,
    /// Checks running: identical attempts join them.
    inflight: HashMap<Tag, Arc<verify::Slot<Outcome>>>,
    throttle: throttle::Throttle,
}

/// The node-wide security state: one per process.
pub struct NodeAuth {
    state: Mutex<AuthState>,
    pool: verify::Pool,
    pub caps: Arc<caps::Caps>,
    keys: (std::hash::RandomState, std::hash::RandomState),
}

static NODE_AUTH: OnceLock<NodeAuth> = OnceLock::new();

/// The process's security state (created on first use).
pub fn node_auth() -> &'static NodeAuth {
    NODE_AUTH.get_or_init(|| NodeAuth {
        state: Mutex::new(AuthState {
            ok: HashMap::new(),
            bad: HashMap::new(),
            inflight: HashMap::new(),
            throttle: throttle::Throttle::new(Instant::now()),
        }),
        pool: verify::bcrypt_pool(),
        caps: Arc::new(caps::Caps::default()),
        keys: (std::hash::RandomState::new(), std::hash::RandomState::new()),
    })
}

impl NodeAuth {
    fn tag(&self, user: &str, password: &[u8]) -> Tag {
        let a = self.keys.0.hash_one((user, password));
        let b = self.keys.1.hash_one((user, password));
        (u128::from(a) << 64) | u128::from(b)
    }

    /// Jobs waiting or running on the bcrypt threads.
    pub fn verify_queued(&self) -> usize {
        self.pool.queued()
    }

    /// Hashes a password on a helper thread.
    pub async fn hash_password(&'static self, password: Vec<u8>) -> Result<String, AuthError> {
        let slot = self
            .pool
            .submit(move || verify::hash_blocking(&password))
            .map_err(|_| AuthError::Busy)?;
        match slot.wait_bounded().await {
            Some(Ok(h)) => Ok(h),
            _ => Err(AuthError::HashFailed),
        }
    }

    /// Checks a password against `hash` on a helper thread, without throttle or caches (the
    /// `current_password` of a password change, from an already authenticated caller).
    pub async fn verify_password(
        &'static self,
        password: Vec<u8>,
        hash: String,
    ) -> Result<bool, AuthError> {
        let slot = self
            .pool
            .submit(move || verify::verify_blocking(&password, &hash))
            .map_err(|_| AuthError::Busy)?;
        match slot.wait_bounded().await {
            Some(Ok(ok)) => Ok(ok),
            _ => Err(AuthError::Unavailable),
        }
    }

    /// Checks a password against `hash` on a helper thread, through the throttle and caches.
    /// Answers `Ok(true)`/`Ok(false)` or why no verdict (throttled, busy, unavailable).
    async fn check(
        &'static self,
        tag: Tag,
        user: &str,
        password: Vec<u8>,
        hash: &str,
    ) -> Result<bool, AuthError> {
        let now = Instant::now();
        let slot = {
            let mut s = lock(&self.state);
            if s.ok.get(&tag).is_some_and(|(u, h)| u == user && h == hash) {
                return Ok(true);
            }
            if s.bad
                .get(&tag)
                .is_some_and(|(h, at)| h == hash && now.duration_since(*at) < NEGATIVE_TTL)
            {
                return Ok(false);
            }
            match s.inflight.get(&tag) {
                Some(slot) => slot.clone(),
                None => {
                    // Usernames without recent failures are checked first (API.md §2).
                    let urgent = !s.throttle.has_recent_failures(user, now);
                    if s.throttle.take(user, now).is_err() {
                        drop(s);
                        audit_login_failure(user, "throttled");
                        return Err(AuthError::Throttled);
                    }
                    let slot = Arc::new(verify::Slot::new());
                    let (s2, u2, h2) = (slot.clone(), user.to_string(), hash.to_string());
                    let job: verify::Job = Box::new(move |ticket| {
                        let r =
                            std::panic::catch_unwind(|| verify::verify_blocking(&password, &h2))
                                .unwrap_or_else(|_| Err("bcrypt panicked".to_string()));
                        node_auth().finish(tag, &u2, &h2, r, &s2, ticket);
                    });
                    if self.pool.submit_job(urgent, job).is_err() {
                        s.throttle.give_back(user, now);
                        return Err(AuthError::Busy);
                    }
                    s.inflight.insert(tag, slot.clone());
                    slot
                }
            }
        };
        match slot.wait_bounded().await {
            Some(Outcome::Ok) => Ok(true),
            Some(Outcome::Bad) => Ok(false),
            Some(Outcome::Unavailable) | None => Err(AuthError::Unavailable),
        }
    }

    /// Records a check's result (on the helper thread) and wakes its waiters.
    fn finish(
        &self,
        tag: Tag,
        user: &str,
        hash: &str,
        r: Result<bool, String>,
        slot: &verify::Slot<Outcome>,
        ticket: verify::Ticket,
    ) {
        let now = Instant::now();
        let outcome = {
            let mut s = lock(&self.state);
            s.inflight.remove(&tag);
            match r {
                Ok(true) => {
                    s.throttle.give_back(user, now);
                    if s.ok.len() >= NODE_OK_CACHE_MAX {
                        s.ok.clear();
                    }
                    s.ok.insert(tag, (user.to_string(), hash.to_string()));
                    s.bad.remove(&tag);
                    Outcome::Ok
                }
                Ok(false) => {
                    if s.bad.len() >= NODE_BAD_CACHE_MAX {
                        s.bad
                            .retain(|_, (_, at)| now.duration_since(*at) < NEGATIVE_TTL);
                        if s.bad.len() >= NODE_BAD_CACHE_MAX {
                            s.bad.clear();
                        }
                    }
                    s.bad.insert(tag, (hash.to_string(), now));
                    Outcome::Bad
                }
                Err(e) => {
                    s.throttle.give_back(user, now);
                    tracing::error!(user, error = %e, "stored password hash is unusable");
                    Outcome::Unavailable
                }
            }
        };
        if outcome == Outcome::Bad {
            audit_login_failure(user, "denied");
        }
        drop(ticket);
        slot.complete(outcome);
    }

    /// The node cache's judgement of a credential, without running a check.
    fn cached(&self, tag: Tag, user: &str, hash: &str) -> Option<bool> {
        let s = lock(&self.state);
        if s.ok.get(&tag).is_some_and(|(u, h)| u == user && h == hash) {
            return Some(true);
        }
        if s.bad
            .get(&tag)
            .is_some_and(|(h, at)| h == hash && Instant::now().duration_since(*at) < NEGATIVE_TTL)
        {
            return Some(false);
        }
        None
    }
}

fn audit_login_failure(user: &str, outcome: &str) {
    tracing::warn!(
        component = "audit",
        event = "auth.failure",
        actor = user,
        target = user,
        outcome,
        "authentication failed"
    );
}

pub use crate::logging::audit;

// ---------------------------------------------------------------------------------------------
// Per shard
// ---------------------------------------------------------------------------------------------

struct ShardAuth {
    node: Weak<Node>,
    /// tag → (username, hash it verified against).
    ok: HashMap<Tag, (String, String)>,
}

thread_local! {
    static SHARD: RefCell<Option<ShardAuth>> = const { RefCell::new(None) };
}

/// Binds this shard thread to its node, so [`precheck`] (which sees only a request head) can
/// read the configuration and the metadata copy.
pub fn attach_shard(node: &Rc<Node>) {
    // Start the helper threads now rather than on the first login.
    let _ = node_auth();
    SHARD.with(|s| {
        *s.borrow_mut() = Some(ShardAuth {
            node: Rc::downgrade(node),
            ok: HashMap::new(),
        })
    });
}

fn shard_node() -> Option<Rc<Node>> {
    SHARD.with(|s| s.borrow().as_ref().and_then(|a| a.node.upgrade()))
}

fn shard_cached(tag: Tag, user: &str, hash: &str) -> bool {
    SHARD.with(|s| {
        s.borrow()
            .as_ref()
            .and_then(|a| a.ok.get(&tag))
            .is_some_and(|(u, h)| u == user && h == hash)
    })
}

fn shard_remember(tag: Tag, user: &str, hash: &str) {
    SHARD.with(|s| {
        if let Some(a) = s.borrow_mut().as_mut() {
            if a.ok.len() >= SHARD_OK_CACHE_MAX {
                a.ok.clear();
            }
            a.ok.insert(tag, (user.to_string(), hash.to_string()));
        }
    })
}

// ---------------------------------------------------------------------------------------------
// The pipeline step
// ---------------------------------------------------------------------------------------------

/// The decoded `Authorization: Basic` credentials.
struct Basic {
    user: String,
    password: Vec<u8>,
}

fn parse_basic(headers: &Headers) -> Option<Basic> {
    let v = headers.get("authorization")?;
    if v.len() > AUTH_HEADER_BYTES_MAX {
        return None;
    }
    let v = std::str::from_utf8(v).ok()?.trim();
    let (scheme, rest) = v.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let raw = crate::wire::base64::decode(rest.trim().as_bytes()).ok()?;
    let colon = raw.iter().position(|&b| b == b':')?;
    let user = String::from_utf8(raw[..colon].to_vec()).ok()?;
    Some(Basic {
        user,
        password: raw[colon + 1..].to_vec(),
    })
}

/// Who is calling, as the handlers need it.
pub struct Caller {
    /// Key of the per-identity caps: the username, or the client IP with security off.
    pub identity: String,
    /// The authenticated username; `None` with security off (then every check passes) and on
    /// exempt paths.
    username: Option<String>,
    meta: Arc<MetaState>,
}

impl Caller {
    pub fn username(&self) -> Option<&str> {
        self.username.as_deref()
    }

    /// The caller's user record as of the metadata it was authenticated against.
    pub fn user(&self) -> Option<&UserMeta> {
        self.username.as_deref().and_then(|u| self.meta.user(u))
    }

    /// Security off: no identity, every grant check passes.
    pub fn open(&self) -> bool {
        self.username.is_none()
    }

    pub fn is_admin(&self) -> bool {
        self.open() || self.user().is_some_and(rbac::is_admin)
    }

    pub fn is_root(&self) -> bool {
        self.user().is_some_and(|u| u.root)
    }

    pub fn may(&self, action: &str, topic: &str) -> bool {
        self.open() || self.user().is_some_and(|u| rbac::may(u, action, topic))
    }

    pub fn may_read(&self, t: &TopicMeta) -> bool {
        self.open() || self.user().is_some_and(|u| rbac::may_read(u, t))
    }

    pub fn may_manage(&self, t: &TopicMeta) -> bool {
        self.open() || self.user().is_some_and(|u| rbac::may_manage(u, t))
    }
}

/// The caller a head alone identifies: nobody to check (security off, exempt path) or a user
/// whose credential a cache already verified, with the metadata it was checked against.
pub struct HeadCaller(Option<(String, Arc<MetaState>)>);

impl HeadCaller {
    /// Whether this caller may do `action` on `topic` (always, with nobody to check).
    pub fn may(&self, action: &str, topic: &str) -> bool {
        match &self.0 {
            None => true,
            Some((u, meta)) => meta.user(u).is_some_and(|x| rbac::may(x, action, topic)),
        }
    }
}

/// What [`precheck`] decided from the head alone.
pub enum Pre {
    /// No credentials needed (security off, exempt path) or already verified.
    Pass(HeadCaller),
    /// Refuse now.
    Deny(AuthError),
    /// A bcrypt check is needed: read the body, then [`authenticate`].
    Pending,
}

enum Fast {
    Open,
    /// A username this replica does not know, in a cluster: it may have been created through
    /// another node a moment ago ([`authenticate`] catches up once, then decides).
    Unknown,
    Verified(String, Arc<MetaState>),
    Deny(AuthError),
    Slow {
        basic: Basic,
        hash: String,
        tag: Tag,
        meta: Arc<MetaState>,
    },
}

/// Paths that skip authentication (API.md §2, §15.3).
fn exempt(node: &Node, path: &str) -> bool {
    match path {
        "/healthz" | "/readyz" => true,
        "/metrics" => !node.config.http.metrics_need_credentials(),
        _ => false,
    }
}

fn fast(node: &Node, headers: &Headers, path: &str) -> Fast {
    if !node.config.security_enabled || exempt(node, path) {
        return Fast::Open;
    }
    let Some(basic) = parse_basic(headers) else {
        return Fast::Deny(AuthError::Unauthorized);
    };
    let meta = node.meta();
    // Unknown usernames: an instant 401, never throttled, indistinguishable from a wrong password
    // (in a cluster, after one catch-up with the leader).
    let Some(user) = meta.user(&basic.user) else {
        if !node.config.peers.is_empty() {
            return Fast::Unknown;
        }
        return Fast::Deny(AuthError::Unauthorized);
    };
    if basic.password.is_empty() || basic.password.len() > PASSWORD_BYTES_MAX {
        return Fast::Deny(AuthError::Unauthorized);
    }
    let na = node_auth();
    let tag = na.tag(&basic.user, &basic.password);
    if shard_cached(tag, &basic.user, &user.password_hash) {
        return Fast::Verified(basic.user, meta.clone());
    }
    match na.cached(tag, &basic.user, &user.password_hash) {
        Some(true) => {
            shard_remember(tag, &basic.user, &user.password_hash);
            Fast::Verified(basic.user, meta.clone())
        }
        Some(false) => Fast::Deny(AuthError::Unauthorized),
        None => {
            let hash = user.password_hash.clone();
            Fast::Slow {
                basic,
                hash,
                tag,
                meta,
            }
        }
    }
}

/// The authentication step from the head alone (API.md §1.4 step 3); `path` is the raw path
/// (exempt paths need no credentials).
pub fn precheck(headers: &Headers, path: &str) -> Pre {
    let Some(node) = shard_node() else {
        return Pre::Deny(AuthError::Unavailable);
    };
    match fast(&node, headers, path) {
        Fast::Open => Pre::Pass(HeadCaller(None)),
        Fast::Verified(u, meta) => Pre::Pass(HeadCaller(Some((u, meta)))),
        Fast::Deny(r) => Pre::Deny(r),
        Fast::Slow { .. } | Fast::Unknown => Pre::Pending,
    }
}

/// The caps identity of a request decided from its head alone (security off: the client IP; a
/// credential a cache already verified: the username); `None` when a bcrypt check is pending
/// or the request will be refused.
pub fn head_identity(headers: &Headers, peer: std::net::SocketAddr, path: &str) -> Option<String> {
    let node = shard_node()?;
    match fast(&node, headers, path) {
        Fast::Open => Some(peer.ip().to_string()),
        Fast::Verified(u, _) => Some(u),
        Fast::Deny(_) | Fast::Slow { .. } | Fast::Unknown => None,
    }
}

/// Authenticates a request, running a bcrypt check on a helper thread when no cache knows the
/// credential. The client IP is the identity with security off; `path` is the raw path.
pub async fn authenticate(
    node: &Rc<Node>,
    headers: &Headers,
    peer: std::net::SocketAddr,
    path: &str,
) -> Result<Caller, AuthError> {
    let mut fast_now = fast(node, headers, path);
    if matches!(fast_now, Fast::Unknown) {
        node.catch_up_meta().await;
        fast_now = match fast(node, headers, path) {
            Fast::Unknown => Fast::Deny(AuthError::Unauthorized),
            other => other,
        };
    }
    match fast_now {
        Fast::Open => Ok(Caller {
            identity: peer.ip().to_string(),
            username: None,
            meta: node.meta(),
        }),
        Fast::Verified(u, meta) => Ok(Caller {
            identity: u.clone(),
            username: Some(u),
            meta,
        }),
        Fast::Unknown => Err(AuthError::Unauthorized),
        Fast::Deny(r) => Err(r),
        Fast::Slow {
            basic,
            hash,
            tag,
            meta,
        } => {
            let Basic { user, password } = basic;
            if node_auth().check(tag, &user, password, &hash).await? {
                shard_remember(tag, &user, &hash);
                Ok(Caller {
                    identity: user.clone(),
                    username: Some(user),
                    meta,
                })
            } else {
                Err(AuthError::Unauthorized)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_header_parsing() {
        // Proves Basic credentials decode (password may hold ':'), other schemes do not.
        let mut h = Headers::default();
        h.push("authorization", b"Basic YWxpY2U6cDp3");
        let b = parse_basic(&h).unwrap();
        assert_eq!(
            (b.user.as_str(), b.password.as_slice()),
            ("alice", &b"p:w"[..])
        );
        let mut h = Headers::default();
        h.push("authorization", b"Bearer xyz");
        assert!(parse_basic(&h).is_none());
        let mut h = Headers::default();
        h.push("authorization", b"Basic !!!");
        assert!(parse_basic(&h).is_none());
    }

    #[test]
    fn tags_differ_by_user_and_password() {
        // Proves the cache tag separates users and passwords.
        let na = node_auth();
        assert_ne!(na.tag("a", b"x"), na.tag("b", b"x"));
        assert_ne!(na.tag("a", b"x"), na.tag("a", b"y"));
        assert_eq!(na.tag("a", b"x"), na.tag("a", b"x"));
    }
}
