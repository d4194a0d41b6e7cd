//! Authorization (API.md §16, SEMANTICS.md §15): grant patterns, topic ownership and the no-escalation
//! rule for grants given by admins. Pure functions of a user record and a topic name: this module
//! never reads a clock, the network or the metadata store.

use narad_raft::{Grant, TopicMeta, UserMeta};

/// The grant actions of API.md §13.2.
pub const ACTION_PRODUCE: &str = "produce";
pub const ACTION_CONSUME: &str = "consume";
pub const ACTION_CREATE: &str = "create";
pub const ACTION_ADMIN: &str = "admin";

/// True when `pattern` matches topic `name`: an exact name, or a prefix with one trailing `*`
/// (`orders-*` matches `orders-eu` and `orders-` but not `orders`; `*` matches everything).
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// True when the user holds the global `admin` grant.
pub fn is_admin(u: &UserMeta) -> bool {
    u.grants.iter().any(|g| g.action == ACTION_ADMIN)
}

/// True when the user may do `action` on topic `name` (admin always may).
pub fn may(u: &UserMeta, action: &str, name: &str) -> bool {
    is_admin(u)
        || u.grants
            .iter()
            .any(|g| g.action == action && g.patterns.iter().any(|p| pattern_matches(p, name)))
}

/// True when any grant of the user (any action) matches topic `name`, or the user is admin.
pub fn may_any(u: &UserMeta, name: &str) -> bool {
    is_admin(u)
        || u.grants
            .iter()
            .any(|g| g.patterns.iter().any(|p| pattern_matches(p, name)))
}

/// True when the user owns the topic (topics created with security off have no owner).
pub fn owns(u: &UserMeta, t: &TopicMeta) -> bool {
    t.owner.as_deref() == Some(u.username.as_str())
}

/// Owner or admin: may alter, delete, attach and detach (SEMANTICS.md §15).
pub fn may_manage(u: &UserMeta, t: &TopicMeta) -> bool {
    is_admin(u) || owns(u, t)
}

/// May read the topic: any matching grant, ownership, or admin (API.md §6.3).
pub fn may_read(u: &UserMeta, t: &TopicMeta) -> bool {
    may_any(u, &t.name) || owns(u, t)
}

/// True when pattern `inner` covers no topic that `outer` does not: every name `inner` matches,
/// `outer` matches too.
fn pattern_covers(outer: &str, inner: &str) -> bool {
    match (outer.strip_suffix('*'), inner.strip_suffix('*')) {
        (Some(op), Some(ip)) => ip.starts_with(op),
        (Some(op), None) => inner.starts_with(op),
        (None, Some(_)) => false,
        (None, None) => outer == inner,
    }
}

/// The no-escalation rule for an admin `giver` handing out `grants` (SEMANTICS.md §15): only the
/// root admin grants `admin`; any admin may give scoped grants (an admin holds every scoped right).
/// A non-admin never gets here (user routes need admin). Returns false on escalation.
pub fn may_give(giver: &UserMeta, grants: &[Grant]) -> bool {
    grants.iter().all(|g| {
        if g.action == ACTION_ADMIN {
            return giver.root;
        }
        is_admin(giver)
            || g.patterns.iter().all(|p| {
                giver
                    .grants
                    .iter()
                    .filter(|h| h.action == g.action)
                    .any(|h| h.patterns.iter().any(|hp| pattern_covers(hp, p)))
            })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(grants: &[(&str, &[&str])]) -> UserMeta {
        UserMeta {
            username: "u".into(),
            password_hash: String::new(),
            grants: grants
                .iter()
                .map(|(a, ps)| Grant {
                    action: a.to_string(),
                    patterns: ps.iter().map(|p| p.to_string()).collect(),
                })
                .collect(),
            root: false,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    #[test]
    fn patterns_match_exact_and_trailing_star() {
        // Proves the pattern rules of SEMANTICS.md §15: exact names, a prefix with a trailing `*`
        // that also matches the bare prefix plus nothing, and `*` matching everything.
        assert!(pattern_matches("orders", "orders"));
        assert!(!pattern_matches("orders", "orders-eu"));
        assert!(!pattern_matches("orders", "Orders"));
        assert!(pattern_matches("orders-*", "orders-eu"));
        assert!(pattern_matches("orders-*", "orders-"));
        assert!(!pattern_matches("orders-*", "orders"));
        assert!(pattern_matches("*", "anything"));
        assert!(pattern_matches("*", ""));
        assert!(!pattern_matches("a*", "ba"));
    }

    #[test]
    fn grants_admin_and_ownership() {
        // Proves action-scoped grants, admin passing everything, read by any grant or ownership.
        let u = user(&[("produce", &["in.*"]), ("consume", &["out"])]);
        assert!(may(&u, "produce", "in.x"));
        assert!(!may(&u, "consume", "in.x"));
        assert!(may(&u, "consume", "out"));
        assert!(!may(&u, "create", "out"));
        assert!(may_any(&u, "in.y") && may_any(&u, "out") && !may_any(&u, "other"));
        let a = user(&[("admin", &[])]);
        assert!(may(&a, "create", "x") && is_admin(&a));
        let mut t = narad_raft::TopicMeta {
            name: "other".into(),
            id: narad_io::types::TopicId(1),
            partitions: 3,
            retention_ms: 0,
            visibility_timeout_ms: 1,
            max_in_flight_per_partition: 1,
            max_acked_ahead_per_partition: 1,
            created_at_s: 0,
            owner: Some("u".into()),
            schemas: vec![],
            parent: None,
            children: vec![],
            attach_epoch: None,
            fanout_delay_ms: 0,
            attach_offsets: vec![],
            owners: Vec::new(),
            moves: Default::default(),
            remote: None,
        };
        assert!(may_read(&u, &t) && may_manage(&u, &t));
        t.owner = None;
        assert!(!may_read(&u, &t) && !may_manage(&u, &t) && may_manage(&a, &t));
    }

    #[test]
    fn no_escalation() {
        // Proves only root gives `admin`, and admins may give any scoped grant.
        let mut admin = user(&[("admin", &[])]);
        let give_admin = [Grant {
            action: "admin".into(),
            patterns: vec![],
        }];
        let give_scoped = [Grant {
            action: "produce".into(),
            patterns: vec!["*".into()],
        }];
        assert!(!may_give(&admin, &give_admin));
        assert!(may_give(&admin, &give_scoped));
        admin.root = true;
        assert!(may_give(&admin, &give_admin));
        let scoped = user(&[("produce", &["a.*"])]);
        assert!(pattern_covers("a.*", "a.b*") && !pattern_covers("a.*", "a*"));
        assert!(!may_give(&scoped, &give_scoped));
    }
}
