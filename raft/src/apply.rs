//! The deterministic state transition: `apply(state, index, command)`.
//!
//! This module owns every rule that depends on the metadata itself (name taken, case-only
//! collision, fan-out roles, children limit, schema adoption and history limits, retention versus
//! delay children, user rules) and the field checks a replica can repeat without context. It never
//! reads a clock, a random source or a file, so every replica applying the same log reaches the
//! same state. A refused command changes nothing (all checks run before the first mutation) but
//! still advances `applied_index`, because its log entry was applied.
//!
//! Things decided before proposing, not here: defaults for zero or absent fields, the caller's
//! rights, schema compilation and the structural compatibility check (the proposer checks against
//! the version it read and sends that version as `schema_base_version`), the attach point offsets.

use serde_json::Value;

use crate::model::*;

/// Applies `cmd` as log entry `index`. `Err` leaves `state` unchanged apart from
/// `applied_index`.
pub fn apply(
    state: &mut MetaState,
    index: u64,
    cmd: MetaCommand,
) -> Result<MetaResponse, MetaError> {
    assert!(
        index > state.applied_index,
        "log index {index} applied after {}: the log went backwards",
        state.applied_index
    );
    state.applied_index = index;
    let touches_topics = matches!(
        cmd,
        MetaCommand::CreateTopic(_)
            | MetaCommand::DeleteTopic { .. }
            | MetaCommand::AlterTopic { .. }
            | MetaCommand::AttachChild { .. }
            | MetaCommand::AttachRemoteChild { .. }
            | MetaCommand::SetRemoteChild { .. }
            | MetaCommand::DetachChild { .. }
            | MetaCommand::DeleteUser { .. }
            | MetaCommand::StartMoves { .. }
            | MetaCommand::FreezeMove { .. }
            | MetaCommand::Unfreeze { .. }
            | MetaCommand::FlipOwner { .. }
            | MetaCommand::EndMove { .. }
    );
    let touches_users = !matches!(
        cmd,
        MetaCommand::CreateTopic(_)
            | MetaCommand::DeleteTopic { .. }
            | MetaCommand::AlterTopic { .. }
            | MetaCommand::AttachChild { .. }
            | MetaCommand::AttachRemoteChild { .. }
            | MetaCommand::SetRemoteChild { .. }
            | MetaCommand::DetachChild { .. }
            | MetaCommand::Heartbeat { .. }
            | MetaCommand::MarkDead { .. }
            | MetaCommand::ForgetServer { .. }
            | MetaCommand::StartMoves { .. }
            | MetaCommand::FreezeMove { .. }
            | MetaCommand::Unfreeze { .. }
            | MetaCommand::FlipOwner { .. }
            | MetaCommand::EndMove { .. }
            | MetaCommand::SetDraining { .. }
            | MetaCommand::RemoveMember { .. }
            | MetaCommand::CreateRemote(_)
            | MetaCommand::UpdateRemote { .. }
            | MetaCommand::DeleteRemote { .. }
    );
    let out = match cmd {
        MetaCommand::CreateTopic(t) => create_topic(state, t),
        MetaCommand::DeleteTopic { name, id } => delete_topic(state, &name, id),
        MetaCommand::AlterTopic {
            name,
            id,
            retention_ms,
            max_in_flight_per_partition,
            max_acked_ahead_per_partition,
            partitions,
            schema,
            schema_base_version,
        } => alter_topic(
            state,
            &name,
            id,
            Alter {
                retention_ms,
                max_in_flight_per_partition,
                max_acked_ahead_per_partition,
                partitions,
                schema,
                schema_base_version,
            },
        ),
        MetaCommand::AttachChild {
            parent,
            parent_id,
            child,
            child_id,
            delay_ms,
            attach_epoch,
            attach_offsets,
        } => attach_child(
            state,
            &parent,
            parent_id,
            &child,
            child_id,
            delay_ms,
            attach_epoch,
            attach_offsets,
        ),
        MetaCommand::AttachRemoteChild {
            parent,
            parent_id,
            stub,
        } => attach_remote_child(state, &parent, parent_id, *stub),
        MetaCommand::SetRemoteChild {
            parent,
            child,
            attach_epoch,
            remote,
        } => set_remote_child(state, &parent, &child, &attach_epoch, remote),
        MetaCommand::DetachChild { parent, child } => detach_child(state, &parent, &child),
        MetaCommand::CreateUser(u) => create_user(state, u),
        MetaCommand::DeleteUser { username } => delete_user(state, &username),
        MetaCommand::SetGrants {
            username,
            grants,
            updated_at_ms,
        } => set_grants(state, &username, grants, updated_at_ms),
        MetaCommand::SetPassword {
            username,
            password_hash,
            updated_at_ms,
        } => set_password(state, &username, password_hash, updated_at_ms),
        MetaCommand::SeedRoot {
            password_hash,
            created_at_ms,
        } => seed_root(state, password_hash, created_at_ms),
        MetaCommand::Heartbeat {
            id,
            addr,
            cluster_addr,
            at_ms,
            backlog,
        } => {
            if state.tombstones.contains_key(&id) {
                return finish(
                    state,
                    Err(MetaError::forbidden(format!(
                        "node {id:?} was decommissioned and removed from the cluster"
                    ))),
                    false,
                    false,
                );
            }
            let m = state
                .members
                .entry(id.clone())
                .or_insert_with(|| MemberMeta {
                    id,
                    addr: String::new(),
                    cluster_addr: String::new(),
                    heartbeat_ms: 0,
                    dead: false,
                    draining: false,
                    backlog: 0,
                });
            m.backlog = backlog;
            m.addr = addr;
            m.cluster_addr = cluster_addr;
            m.heartbeat_ms = m.heartbeat_ms.max(at_ms);
            m.dead = false;
            Ok(MetaResponse::Done)
        }
        MetaCommand::MarkDead { ids } => {
            for id in ids {
                if let Some(m) = state.members.get_mut(&id) {
                    m.dead = true;
                }
            }
            Ok(MetaResponse::Done)
        }
        // A membership change, run by the leader outside the log (`MetaNode::propose_here`).
        MetaCommand::ForgetServer { .. } => Err(MetaError::invalid(
            "forgetting a server is a membership change, not a log entry",
        )),
        MetaCommand::StartMoves { moves, at_ms } => crate::moves::start_moves(state, moves, at_ms),
        MetaCommand::FreezeMove {
            topic,
            id,
            partition,
            target,
            token,
        } => crate::moves::freeze(state, &topic, id, partition, &target, token),
        MetaCommand::Unfreeze {
            topic,
            id,
            partition,
            token,
        } => crate::moves::unfreeze(state, &topic, id, partition, token),
        MetaCommand::FlipOwner {
            topic,
            id,
            partition,
            source,
            target,
            token,
        } => crate::moves::flip(state, &topic, id, partition, &source, &target, token),
        MetaCommand::EndMove {
            topic,
            partition,
            target,
        } => crate::moves::end_move(state, &topic, partition, target.as_deref()),
        MetaCommand::SetDraining { id, draining } => match state.members.get_mut(&id) {
            Some(m) => {
                m.draining = draining;
                Ok(MetaResponse::Done)
            }
            None => Err(MetaError::not_found(format!("member {id:?} not found"))),
        },
        MetaCommand::RemoveMember { id, at_ms } => crate::moves::remove_member(state, &id, at_ms),
        MetaCommand::CreateRemote(r) => {
            if state.remotes.contains_key(&r.name) {
                Err(MetaError::conflict(format!(
                    "remote {:?} already exists",
                    r.name
                )))
            } else if state.remotes.len() >= REMOTES_MAX {
                Err(MetaError::conflict(format!(
                    "a cluster holds at most {REMOTES_MAX} remotes"
                )))
            } else {
                let mut r = r;
                r.revision = 1;
                state.remotes.insert(r.name.clone(), r.clone());
                Ok(MetaResponse::Remote(r))
            }
        }
        MetaCommand::UpdateRemote {
            remote,
            base_revision,
        } => match state.remotes.get_mut(&remote.name) {
            None => Err(MetaError::not_found(format!(
                "remote {:?} not found",
                remote.name
            ))),
            Some(cur) if cur.id != remote.id || cur.revision != base_revision => {
                Err(MetaError::conflict(format!(
                    "remote {:?} was changed concurrently (or recreated); read it again",
                    remote.name
                )))
            }
            Some(cur) => {
                let mut r = remote;
                r.revision = base_revision + 1;
                *cur = r.clone();
                Ok(MetaResponse::Remote(r))
            }
        },
        MetaCommand::DeleteRemote { name } => match state.remotes.remove(&name) {
            Some(_) => Ok(MetaResponse::Done),
            None => Err(MetaError::not_found(format!("remote {name:?} not found"))),
        },
    };
    finish(state, out, touches_topics, touches_users)
}

/// Bumps the versions a successful command touched and checks the invariants (debug builds).
fn finish(
    state: &mut MetaState,
    out: Result<MetaResponse, MetaError>,
    touches_topics: bool,
    touches_users: bool,
) -> Result<MetaResponse, MetaError> {
    if out.is_ok() {
        if touches_topics {
            state.topics_version += 1;
        }
        if touches_users {
            state.users_version += 1;
        }
    }
    debug_assert!(
        check_invariants(state).is_ok(),
        "{:?}",
        check_invariants(state)
    );
    out
}

/// The fan-out link invariants: every child's parent lists it, every listed child points back,
/// roles are flat, attached children carry their parent's schema history.
pub fn check_invariants(state: &MetaState) -> Result<(), String> {
    for t in state.topics.values() {
        if t.parent.is_some() && !t.children.is_empty() {
            return Err(format!("{} is both parent and child", t.name));
        }
        if t.parent.is_some() != t.attach_epoch.is_some() {
            return Err(format!("{}: parent and attach_epoch disagree", t.name));
        }
        if let Some(p) = &t.parent {
            let Some(pt) = state.topics.get(p) else {
                return Err(format!("{}: parent {p} missing", t.name));
            };
            if !pt.children.contains(&t.name) {
                return Err(format!("{}: parent {p} does not list it", t.name));
            }
            if pt.schemas != t.schemas {
                return Err(format!(
                    "{}: schema history differs from parent {p}",
                    t.name
                ));
            }
            if t.attach_offsets.len() != pt.partitions as usize {
                return Err(format!(
                    "{}: attach_offsets length differs from parent",
                    t.name
                ));
            }
        }
        for c in &t.children {
            match state.topics.get(c) {
                Some(ct) if ct.parent.as_deref() == Some(t.name.as_str()) => {}
                _ => return Err(format!("{}: child {c} does not point back", t.name)),
            }
        }
    }
    Ok(())
}

fn topic_not_found() -> MetaError {
    MetaError::not_found("topic not found")
}

fn topic_changed() -> MetaError {
    MetaError::conflict("topic changed since it was read")
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '.' || c == '_' || c == '-'
}

/// Checks a new topic's name (SEMANTICS.md §14.1).
pub fn validate_topic_name(name: &str) -> Result<(), MetaError> {
    let ok = !name.is_empty()
        && name.len() <= TOPIC_NAME_CHARS_MAX
        && name != "."
        && name != ".."
        && name.chars().all(is_name_char);
    if ok {
        Ok(())
    } else {
        Err(MetaError::invalid(
            "invalid argument: topic name must be 1-200 characters of A-Z a-z 0-9 . _ - and not \".\" or \"..\"",
        ))
    }
}

/// Checks a username (API.md §11.1).
pub fn validate_username(name: &str) -> Result<(), MetaError> {
    let ok = !name.is_empty()
        && name.len() <= USERNAME_CHARS_MAX
        && name != "."
        && name != ".."
        && name.chars().all(is_name_char);
    if ok {
        Ok(())
    } else {
        Err(MetaError::invalid(
            "username must match ^[A-Za-z0-9._-]{1,64}$",
        ))
    }
}

/// Checks a list of grants (API.md §13.2).
pub fn validate_grants(grants: &[Grant]) -> Result<(), MetaError> {
    if grants.len() > GRANTS_PER_USER_MAX {
        return Err(MetaError::invalid(format!(
            "too many grants: more than {GRANTS_PER_USER_MAX}"
        )));
    }
    for g in grants {
        match g.action.as_str() {
            "produce" | "consume" | "create" => {
                if g.patterns.is_empty() {
                    return Err(MetaError::invalid(format!(
                        "grant \"{}\" requires at least one topic pattern",
                        g.action
                    )));
                }
            }
            "admin" => {
                if !g.patterns.is_empty() {
                    return Err(MetaError::invalid(
                        "admin grants are global and must not carry patterns",
                    ));
                }
            }
            other => {
                return Err(MetaError::invalid(format!(
                    "unknown grant action \"{other}\""
                )));
            }
        }
        if g.patterns.len() > PATTERNS_PER_GRANT_MAX {
            return Err(MetaError::invalid(format!(
                "too many patterns in grant \"{}\": more than {PATTERNS_PER_GRANT_MAX}",
                g.action
            )));
        }
        for p in &g.patterns {
            validate_pattern(p)?;
        }
    }
    Ok(())
}

fn validate_pattern(p: &str) -> Result<(), MetaError> {
    if p.is_empty() {
        return Err(MetaError::invalid("grant pattern must not be empty"));
    }
    let body = p.strip_suffix('*').unwrap_or(p);
    if body.contains('*') {
        return Err(MetaError::invalid(format!(
            "grant pattern \"{p}\": '*' is only allowed once, at the end"
        )));
    }
    if body.len() > GRANT_PATTERN_CHARS_MAX || !body.chars().all(is_name_char) {
        return Err(MetaError::invalid(format!(
            "grant pattern \"{p}\" must be up to 255 topic-name characters with an optional trailing '*'"
        )));
    }
    Ok(())
}

fn validate_retention(retention_ms: u64) -> Result<(), MetaError> {
    if retention_ms != 0 && retention_ms < RETENTION_MS_MIN {
        return Err(MetaError::invalid(format!(
            "invalid argument: retention_ms ({retention_ms}) is below the minimum of 3600000 (1 hour)"
        )));
    }
    Ok(())
}

fn validate_schema_doc(v: &Value) -> Result<(), MetaError> {
    match v {
        Value::Object(_) | Value::Bool(true) => Ok(()),
        Value::Null => Err(MetaError::invalid(
            "invalid argument: schema cannot be removed (null)",
        )),
        _ => Err(MetaError::invalid(
            "invalid argument: schema must be a JSON object or true",
        )),
    }
}

fn validate_epoch(epoch: &str) -> Result<(), MetaError> {
    if epoch.len() == 16
        && epoch
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(())
    } else {
        Err(MetaError::invalid(
            "invalid argument: attach_epoch must be 16 lowercase hex characters",
        ))
    }
}

fn cluster_schema_bytes(state: &MetaState) -> usize {
    state.topics.values().map(TopicMeta::schema_bytes).sum()
}

/// Checks the per-topic and cluster-wide schema budgets for a history of `topic_bytes` that adds
/// `added_bytes` to the cluster total.
fn check_schema_budget(
    state: &MetaState,
    name: &str,
    topic_bytes: usize,
    added_bytes: usize,
) -> Result<(), MetaError> {
    if topic_bytes > SCHEMA_TOPIC_BYTES_MAX {
        return Err(MetaError::conflict(format!(
            "schema budget exceeded: topic \"{name}\" would store {topic_bytes} bytes of schema history (limit {SCHEMA_TOPIC_BYTES_MAX})"
        )));
    }
    if added_bytes > 0 {
        let total = cluster_schema_bytes(state) + added_bytes;
        if total > SCHEMA_CLUSTER_BYTES_MAX {
            return Err(MetaError::conflict(format!(
                "schema budget exceeded: the cluster would store {total} bytes of schema history (limit {SCHEMA_CLUSTER_BYTES_MAX})"
            )));
        }
    }
    Ok(())
}

fn delay_check(parent: &TopicMeta, retention_ms: u64, delay_ms: u64) -> Result<(), MetaError> {
    if delay_ms > 0 && retention_ms != 0 && retention_ms < delay_ms.saturating_add(RETENTION_MS_MIN)
    {
        return Err(MetaError::conflict(format!(
            "delay exceeds what the parent's retention can buffer: parent \"{}\" retention ({retention_ms}ms) must be at least delay ({delay_ms}ms) + 3600000ms",
            parent.name
        )));
    }
    Ok(())
}

/// The rules for putting `child_name` (with schema history `child_schemas`, existing record
/// `child` if it exists already) under `parent`. Returns the child's schema history after the
/// attach.
#[allow(clippy::too_many_arguments)]
fn check_attach(
    state: &MetaState,
    parent: &TopicMeta,
    child_name: &str,
    child: Option<&TopicMeta>,
    child_schemas: &[Value],
    delay_ms: u64,
    delay_field: &str,
    attach_epoch: &str,
    attach_offsets: &[u64],
) -> Result<Vec<Value>, MetaError> {
    if parent.name == child_name {
        return Err(MetaError::invalid(
            "invalid argument: a topic cannot be its own parent",
        ));
    }
    if delay_ms > FANOUT_DELAY_MS_MAX {
        return Err(MetaError::invalid(format!(
            "invalid argument: {delay_field} must be <= {FANOUT_DELAY_MS_MAX}"
        )));
    }
    validate_epoch(attach_epoch)?;
    if let Some(grand) = &parent.parent {
        return Err(MetaError::conflict(format!(
            "fan-out role conflict: \"{}\" is a child of \"{grand}\" and cannot have children",
            parent.name
        )));
    }
    if let Some(c) = child {
        if !c.children.is_empty() {
            return Err(MetaError::conflict(format!(
                "fan-out role conflict: \"{child_name}\" is a parent and cannot become a child"
            )));
        }
        match &c.parent {
            Some(p) if *p == parent.name => {
                return Err(MetaError::conflict(format!(
                    "already exists: \"{child_name}\" is already attached to \"{p}\""
                )));
            }
            Some(p) => {
                return Err(MetaError::conflict(format!(
                    "fan-out role conflict: \"{child_name}\" is already attached to \"{p}\""
                )));
            }
            None => {}
        }
    }
    if parent.children.len() >= CHILDREN_MAX {
        return Err(MetaError::conflict(format!(
            "parent has reached the maximum number of children: \"{}\" has {CHILDREN_MAX}",
            parent.name
        )));
    }
    let adopted = if parent.schemas.is_empty() {
        if !child_schemas.is_empty() {
            return Err(MetaError::conflict(format!(
                "child schema incompatible with parent: \"{child_name}\" has a schema and \"{}\" has none",
                parent.name
            )));
        }
        Vec::new()
    } else if child_schemas.is_empty() || child_schemas == parent.schemas.as_slice() {
        parent.schemas.clone()
    } else {
        return Err(MetaError::conflict(format!(
            "child schema incompatible with parent: the schema history of \"{child_name}\" differs from that of \"{}\"",
            parent.name
        )));
    };
    delay_check(parent, parent.retention_ms, delay_ms)?;
    if attach_offsets.len() != parent.partitions as usize {
        return Err(MetaError::conflict(format!(
            "topic changed since it was read: parent \"{}\" has {} partitions, the attach point has {}",
            parent.name,
            parent.partitions,
            attach_offsets.len()
        )));
    }
    let old_bytes: usize = child_schemas.iter().map(json_len).sum();
    let new_bytes: usize = adopted.iter().map(json_len).sum();
    check_schema_budget(
        state,
        child_name,
        new_bytes,
        new_bytes.saturating_sub(old_bytes),
    )?;
    Ok(adopted)
}

fn create_topic(state: &mut MetaState, mut t: TopicMeta) -> Result<MetaResponse, MetaError> {
    validate_topic_name(&t.name)?;
    if state.topics.contains_key(&t.name) {
        return Err(MetaError::conflict("topic already exists"));
    }
    if let Some(existing) = state.topic_case_insensitive(&t.name) {
        return Err(MetaError::conflict(format!(
            "topic name \"{}\" differs only in letter case from existing topic \"{}\"",
            t.name, existing.name
        )));
    }
    if state.topics.values().any(|o| o.id == t.id) {
        return Err(MetaError::conflict("topic id collision; retry"));
    }
    if t.partitions < PARTITIONS_MIN {
        return Err(MetaError::invalid(
            "invalid argument: partitions must be >= 3 (0 = use default)",
        ));
    }
    if t.partitions > PARTITIONS_HARD_MAX {
        return Err(MetaError::invalid(format!(
            "invalid argument: partitions ({}) exceeds the hard limit of {PARTITIONS_HARD_MAX}",
            t.partitions
        )));
    }
    validate_retention(t.retention_ms)?;
    for (field, v) in [
        ("visibility_timeout_ms", t.visibility_timeout_ms),
        ("max_in_flight_per_partition", t.max_in_flight_per_partition),
        (
            "max_acked_ahead_per_partition",
            t.max_acked_ahead_per_partition,
        ),
    ] {
        if v == 0 {
            return Err(MetaError::invalid(format!(
                "invalid argument: {field} must be > 0"
            )));
        }
    }
    if !t.children.is_empty() {
        return Err(MetaError::invalid(
            "invalid argument: a new topic cannot have children",
        ));
    }
    if t.schemas.len() > SCHEMA_VERSIONS_MAX {
        return Err(MetaError::conflict(format!(
            "schema history is full: at most {SCHEMA_VERSIONS_MAX} versions per topic"
        )));
    }
    for s in &t.schemas {
        validate_schema_doc(s)?;
    }
    match t.parent.clone() {
        None => {
            if t.fanout_delay_ms != 0 {
                return Err(MetaError::invalid(
                    "invalid argument: fanout_delay_ms requires parent",
                ));
            }
            if t.attach_epoch.is_some() || !t.attach_offsets.is_empty() {
                return Err(MetaError::invalid(
                    "invalid argument: attach_epoch and attach_offsets require parent",
                ));
            }
            let bytes = t.schema_bytes();
            check_schema_budget(state, &t.name, bytes, bytes)?;
        }
        Some(p) => {
            if p == t.name {
                return Err(MetaError::invalid(
                    "invalid argument: a topic cannot be its own parent",
                ));
            }
            let parent = state.topics.get(&p).ok_or_else(topic_not_found)?;
            let epoch = t.attach_epoch.clone().unwrap_or_default();
            t.schemas = check_attach(
                state,
                parent,
                &t.name,
                None,
                &t.schemas,
                t.fanout_delay_ms,
                "fanout_delay_ms",
                &epoch,
                &t.attach_offsets,
            )?;
        }
    }
    // All checks passed: mutate.
    if let Some(p) = &t.parent {
        if let Some(parent) = state.topics.get_mut(p) {
            parent.children.push(t.name.clone());
        }
    }
    state.topics.insert(t.name.clone(), t.clone());
    Ok(MetaResponse::Topic(t))
}

fn delete_topic(
    state: &mut MetaState,
    name: &str,
    id: narad_io::types::TopicId,
) -> Result<MetaResponse, MetaError> {
    let t = state.topics.get(name).ok_or_else(topic_not_found)?;
    if t.id != id {
        return Err(topic_changed());
    }
    let Some(t) = state.topics.remove(name) else {
        return Err(topic_not_found());
    };
    if let Some(p) = &t.parent {
        if let Some(parent) = state.topics.get_mut(p) {
            parent.children.retain(|c| c != name);
        }
    }
    for c in &t.children {
        if state.topics.get(c).is_some_and(|c| c.remote.is_some()) {
            // A remote child's stub goes with its parent.
            state.topics.remove(c);
        } else if let Some(child) = state.topics.get_mut(c) {
            make_standalone(child);
        }
    }
    Ok(MetaResponse::Done)
}

fn make_standalone(child: &mut TopicMeta) {
    child.parent = None;
    child.attach_epoch = None;
    child.fanout_delay_ms = 0;
    child.attach_offsets.clear();
}

struct Alter {
    retention_ms: Option<u64>,
    max_in_flight_per_partition: Option<u64>,
    max_acked_ahead_per_partition: Option<u64>,
    partitions: Option<u32>,
    schema: Option<Value>,
    schema_base_version: Option<u32>,
}

fn alter_topic(
    state: &mut MetaState,
    name: &str,
    id: narad_io::types::TopicId,
    a: Alter,
) -> Result<MetaResponse, MetaError> {
    let t = state.topics.get(name).ok_or_else(topic_not_found)?;
    if t.id != id {
        return Err(topic_changed());
    }
    if a.retention_ms.is_none()
        && a.max_in_flight_per_partition.is_none()
        && a.max_acked_ahead_per_partition.is_none()
        && a.partitions.is_none()
        && a.schema.is_none()
    {
        return Err(MetaError::invalid(
            "at least one of partitions, retention_ms, max_*_per_partition, or schema is required",
        ));
    }
    // Checks, in the order the fields apply: retention, caps, partitions, schema.
    if let Some(r) = a.retention_ms {
        validate_retention(r)?;
        for c in &t.children {
            if let Some(child) = state.topics.get(c) {
                delay_check(t, r, child.fanout_delay_ms)?;
            }
        }
    }
    for (field, v) in [
        ("max_in_flight_per_partition", a.max_in_flight_per_partition),
        (
            "max_acked_ahead_per_partition",
            a.max_acked_ahead_per_partition,
        ),
    ] {
        if v == Some(0) {
            return Err(MetaError::invalid(format!(
                "invalid argument: {field} must be > 0"
            )));
        }
    }
    if let Some(n) = a.partitions {
        if n <= t.partitions {
            return Err(MetaError::invalid(format!(
                "invalid argument: new partition count ({n}) must be greater than current ({}); decrease is not supported",
                t.partitions
            )));
        }
        if n > PARTITIONS_HARD_MAX {
            return Err(MetaError::invalid(format!(
                "invalid argument: partitions ({n}) exceeds the hard limit of {PARTITIONS_HARD_MAX}"
            )));
        }
    }
    let mut new_schema = None;
    if let Some(s) = &a.schema {
        validate_schema_doc(s)?;
        if let Some(base) = a.schema_base_version {
            if base != t.schema_version() {
                return Err(MetaError::conflict("schema version conflict"));
            }
        }
        if t.current_schema() != Some(s) {
            if let Some(p) = &t.parent {
                return Err(MetaError::conflict(format!(
                    "schema is parent-managed while attached to a fan-out parent: topic \"{name}\" is attached to \"{p}\""
                )));
            }
            if t.schemas.len() >= SCHEMA_VERSIONS_MAX {
                return Err(MetaError::conflict(format!(
                    "schema history is full: topic \"{name}\" has {SCHEMA_VERSIONS_MAX} versions"
                )));
            }
            // The new version lands on the topic and on every attached child.
            let len = json_len(s);
            let copies = 1 + t.children.len();
            check_schema_budget(state, name, t.schema_bytes() + len, len * copies)?;
            new_schema = Some(s.clone());
        }
    }
    // All checks passed: mutate.
    let Some(t) = state.topics.get_mut(name) else {
        return Err(topic_not_found());
    };
    if let Some(r) = a.retention_ms {
        t.retention_ms = r;
    }
    if let Some(v) = a.max_in_flight_per_partition {
        t.max_in_flight_per_partition = v;
    }
    if let Some(v) = a.max_acked_ahead_per_partition {
        t.max_acked_ahead_per_partition = v;
    }
    let mut grown = None;
    if let Some(n) = a.partitions {
        t.partitions = n;
        grown = Some(n);
    }
    if let Some(s) = new_schema {
        t.schemas.push(s);
    }
    let after = t.clone();
    for c in &after.children {
        if let Some(child) = state.topics.get_mut(c) {
            child.schemas.clone_from(&after.schemas);
            if let Some(n) = grown {
                // New parent partitions start empty: their attach point is offset 0.
                child.attach_offsets.resize(n as usize, 0);
            }
        }
    }
    Ok(MetaResponse::Topic(after))
}

#[allow(clippy::too_many_arguments)]
fn attach_child(
    state: &mut MetaState,
    parent_name: &str,
    parent_id: Option<narad_io::types::TopicId>,
    child_name: &str,
    child_id: Option<narad_io::types::TopicId>,
    delay_ms: u64,
    attach_epoch: String,
    attach_offsets: Vec<u64>,
) -> Result<MetaResponse, MetaError> {
    if parent_name == child_name {
        return Err(MetaError::invalid(
            "invalid argument: a topic cannot be its own parent",
        ));
    }
    let parent = state.topics.get(parent_name).ok_or_else(topic_not_found)?;
    let child = state.topics.get(child_name).ok_or_else(topic_not_found)?;
    if parent_id.is_some_and(|id| id != parent.id) || child_id.is_some_and(|id| id != child.id) {
        return Err(topic_changed());
    }
    let schemas = check_attach(
        state,
        parent,
        child_name,
        Some(child),
        &child.schemas,
        delay_ms,
        "delay_ms",
        &attach_epoch,
        &attach_offsets,
    )?;
    let Some(child) = state.topics.get_mut(child_name) else {
        return Err(topic_not_found());
    };
    child.parent = Some(parent_name.to_string());
    child.attach_epoch = Some(attach_epoch);
    child.fanout_delay_ms = delay_ms;
    child.attach_offsets = attach_offsets;
    child.schemas = schemas;
    let Some(parent) = state.topics.get_mut(parent_name) else {
        return Err(topic_not_found());
    };
    parent.children.push(child_name.to_string());
    Ok(MetaResponse::Topic(parent.clone()))
}

/// Creates a remote child's stub and links it (API.md §9.1 with `remote`). The proposer ran the
/// checks that need the target; these are the ones that must hold cluster-wide.
fn attach_remote_child(
    state: &mut MetaState,
    parent_name: &str,
    parent_id: narad_io::types::TopicId,
    stub: TopicMeta,
) -> Result<MetaResponse, MetaError> {
    validate_topic_name(&stub.name)?;
    let parent = state.topics.get(parent_name).ok_or_else(topic_not_found)?;
    if parent.id != parent_id {
        return Err(topic_changed());
    }
    let Some(rc) = &stub.remote else {
        return Err(MetaError::invalid("invalid argument: remote is required"));
    };
    if stub.partitions != 0 || stub.parent.as_deref() != Some(parent_name) {
        return Err(MetaError::invalid(
            "invalid argument: a remote child's stub has no partitions and names its parent",
        ));
    }
    if state.topics.contains_key(&stub.name) || state.topic_case_insensitive(&stub.name).is_some() {
        return Err(MetaError::conflict(format!(
            "child exists: topic {:?} already exists (a remote child is a new name)",
            stub.name
        )));
    }
    if state.topics.values().any(|o| o.id == stub.id) {
        return Err(MetaError::conflict("topic id collision; retry"));
    }
    if !state.remotes.contains_key(&rc.name) {
        return Err(MetaError::invalid(format!(
            "invalid argument: unknown remote {:?}",
            rc.name
        )));
    }
    if parent.parent.is_some() || parent.remote.is_some() {
        return Err(MetaError::conflict(format!(
            "fan-out role conflict: {parent_name:?} is a child"
        )));
    }
    let remote_children: Vec<&TopicMeta> = parent
        .children
        .iter()
        .filter_map(|c| state.topics.get(c))
        .filter(|c| c.remote.is_some())
        .collect();
    if remote_children.len() >= REMOTE_CHILDREN_MAX {
        return Err(MetaError::conflict(format!(
            "parent has reached the maximum of {REMOTE_CHILDREN_MAX} remote children"
        )));
    }
    let same_link = |t: &TopicMeta| {
        t.remote
            .as_ref()
            .is_some_and(|r| r.name == rc.name && r.topic == rc.topic)
    };
    if let Some(other) = state.topics.values().find(|t| same_link(t)) {
        return Err(MetaError::conflict(format!(
            "a link to remote topic {:?} on remote {:?} exists: {:?}",
            rc.topic, rc.name, other.name
        )));
    }
    if stub.attach_epoch.is_none() || stub.attach_offsets.len() != parent.partitions as usize {
        return Err(MetaError::invalid(
            "invalid argument: attach_offsets must name every parent partition",
        ));
    }
    let name = stub.name.clone();
    state.topics.insert(name.clone(), stub.clone());
    if let Some(parent) = state.topics.get_mut(parent_name) {
        parent.children.push(name);
    }
    Ok(MetaResponse::Topic(stub))
}

/// Replaces a remote child's `remote` object (pause, resume, skip) while its link is the one
/// the proposer read (`attach_epoch`): `409` when it was re-attached meanwhile.
fn set_remote_child(
    state: &mut MetaState,
    parent_name: &str,
    child_name: &str,
    attach_epoch: &str,
    remote: RemoteChildMeta,
) -> Result<MetaResponse, MetaError> {
    let child = state
        .topics
        .get_mut(child_name)
        .ok_or_else(topic_not_found)?;
    if child.parent.as_deref() != Some(parent_name) || child.remote.is_none() {
        return Err(MetaError::not_found(format!(
            "not found: \"{child_name}\" is not a remote child of \"{parent_name}\""
        )));
    }
    if child.attach_epoch.as_deref() != Some(attach_epoch) {
        return Err(MetaError::conflict(
            "the remote child was re-attached meanwhile; retry",
        ));
    }
    if remote.skip.values().any(|v| v.len() > REMOTE_SKIPS_MAX) {
        return Err(MetaError::conflict(format!(
            "at most {REMOTE_SKIPS_MAX} skipped records per partition"
        )));
    }
    child.remote = Some(remote);
    Ok(MetaResponse::Topic(child.clone()))
}

fn detach_child(
    state: &mut MetaState,
    parent_name: &str,
    child_name: &str,
) -> Result<MetaResponse, MetaError> {
    let parent = state.topics.get(parent_name).ok_or_else(topic_not_found)?;
    let child = state.topics.get(child_name).ok_or_else(topic_not_found)?;
    if child.parent.as_deref() != Some(parent_name)
        || !parent.children.iter().any(|c| c == child_name)
    {
        return Err(MetaError::not_found(format!(
            "not found: \"{child_name}\" is not attached to \"{parent_name}\""
        )));
    }
    if child.remote.is_some() {
        // A remote child's stub holds nothing: it goes with its link.
        state.topics.remove(child_name);
    } else if let Some(child) = state.topics.get_mut(child_name) {
        make_standalone(child);
    }
    if let Some(parent) = state.topics.get_mut(parent_name) {
        parent.children.retain(|c| c != child_name);
    }
    Ok(MetaResponse::Done)
}

fn user_not_found() -> MetaError {
    MetaError::not_found("user not found")
}

fn create_user(state: &mut MetaState, u: UserMeta) -> Result<MetaResponse, MetaError> {
    validate_username(&u.username)?;
    validate_grants(&u.grants)?;
    if u.root {
        return Err(MetaError::invalid(
            "invalid argument: only the seeded admin is root",
        ));
    }
    if u.password_hash.is_empty() {
        return Err(MetaError::invalid("password required"));
    }
    if state.users.contains_key(&u.username) {
        return Err(MetaError::conflict("user already exists"));
    }
    state.users.insert(u.username.clone(), u.clone());
    Ok(MetaResponse::User(u))
}

fn delete_user(state: &mut MetaState, username: &str) -> Result<MetaResponse, MetaError> {
    let u = state.users.get(username).ok_or_else(user_not_found)?;
    if u.root {
        return Err(MetaError::forbidden("the root admin cannot be deleted"));
    }
    state.users.remove(username);
    // A later user of the same name must not inherit these topics (SEMANTICS.md §15).
    for t in state.topics.values_mut() {
        if t.owner.as_deref() == Some(username) {
            t.owner = None;
        }
    }
    Ok(MetaResponse::Done)
}

fn set_grants(
    state: &mut MetaState,
    username: &str,
    grants: Vec<Grant>,
    updated_at_ms: u64,
) -> Result<MetaResponse, MetaError> {
    let u = state.users.get(username).ok_or_else(user_not_found)?;
    if u.root {
        return Err(MetaError::forbidden(
            "the root admin's grants are immutable",
        ));
    }
    validate_grants(&grants)?;
    let Some(u) = state.users.get_mut(username) else {
        return Err(user_not_found());
    };
    u.grants = grants;
    u.updated_at_ms = updated_at_ms;
    Ok(MetaResponse::User(u.clone()))
}

fn set_password(
    state: &mut MetaState,
    username: &str,
    password_hash: String,
    updated_at_ms: u64,
) -> Result<MetaResponse, MetaError> {
    if password_hash.is_empty() {
        return Err(MetaError::invalid("new_password required"));
    }
    let u = state.users.get_mut(username).ok_or_else(user_not_found)?;
    u.password_hash = password_hash;
    u.updated_at_ms = updated_at_ms;
    Ok(MetaResponse::User(u.clone()))
}

/// Username of the seeded root admin.
pub const ROOT_USERNAME: &str = "admin";

fn seed_root(
    state: &mut MetaState,
    password_hash: String,
    created_at_ms: u64,
) -> Result<MetaResponse, MetaError> {
    if !state.users.is_empty() {
        return Err(MetaError::conflict(
            "users already exist; the root admin is seeded only once",
        ));
    }
    if password_hash.is_empty() {
        return Err(MetaError::invalid("password required"));
    }
    let u = UserMeta {
        username: ROOT_USERNAME.to_string(),
        password_hash,
        grants: vec![Grant {
            action: "admin".to_string(),
            patterns: Vec::new(),
        }],
        root: true,
        created_at_ms,
        updated_at_ms: created_at_ms,
    };
    state.users.insert(u.username.clone(), u.clone());
    Ok(MetaResponse::User(u))
}

#[cfg(test)]
#[path = "apply_tests.rs"]
mod tests;
