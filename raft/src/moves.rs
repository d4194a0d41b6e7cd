//! Partition moves and decommission in the metadata (CLUSTER.md §9–10): the planner, a pure
//! function of the state run by the leader, and the apply side of the move commands — each one a
//! compare-and-swap on the assignment, so a stale or repeated command changes nothing.

use std::collections::BTreeMap;

use narad_io::types::TopicId;

use crate::model::*;

/// Moves in flight at once over the whole cluster (CLUSTER.md §9.2 `MaxInFlightMoves`).
pub const MAX_IN_FLIGHT_MOVES: usize = 8;

/// The moves that bring the owned-partition counts of the receivers (alive, non-draining
/// members) to ⌊T/R⌋ or ⌈T/R⌉ with the fewest moves (CLUSTER.md §9.2). Moves in flight count at
/// their destination and are not moved again; partitions of dead owners are left alone, and so
/// are partitions whose owner has no member record; draining members keep nothing. At most
/// `MAX_IN_FLIGHT_MOVES` in flight, counting those already running. Deterministic: the same state
/// gives the same plan on any node.
pub fn plan(state: &MetaState) -> Vec<PlannedMove> {
    let receivers: Vec<&str> = state
        .members
        .values()
        .filter(|m| m.receives() && !state.tombstones.contains_key(&m.id))
        .map(|m| m.id.as_str())
        .collect();
    let in_flight: usize = state.topics.values().map(|t| t.moves.len()).sum();
    let slots = MAX_IN_FLIGHT_MOVES.saturating_sub(in_flight);
    if receivers.is_empty() || slots == 0 {
        return Vec::new();
    }
    let mut load: BTreeMap<&str, u64> = receivers.iter().map(|r| (*r, 0)).collect();
    // Per member, the partitions it owns that may move, in topic then partition order.
    let mut movable: BTreeMap<&str, Vec<(&TopicMeta, u32)>> = BTreeMap::new();
    for t in state.topics.values() {
        for p in 0..t.partitions {
            if let Some(m) = t.moves.get(&p) {
                *load.entry(m.target.as_str()).or_default() += 1;
                continue;
            }
            let Some(owner) = t.owner_of(p) else { continue };
            match state.members.get(owner) {
                Some(m) if !m.dead => {
                    *load.entry(owner).or_default() += 1;
                    movable.entry(owner).or_default().push((t, p));
                }
                _ => {}
            }
        }
    }
    let total: u64 = load.values().sum();
    let r = receivers.len() as u64;
    let (floor, extra) = (total / r, total % r);
    // The receivers holding most keep the ⌈T/R⌉ slots.
    let mut by_load = receivers.clone();
    by_load.sort_by(|a, b| load[b].cmp(&load[a]).then(a.cmp(b)));
    let mut quota: BTreeMap<&str, u64> = load.keys().map(|k| (*k, 0)).collect();
    for (i, id) in by_load.iter().enumerate() {
        quota.insert(id, floor + u64::from((i as u64) < extra));
    }
    // Deficits of the receivers below their share, largest first.
    let mut deficit: Vec<(&str, u64)> = receivers
        .iter()
        .filter(|id| load[**id] < quota[**id])
        .map(|id| (*id, quota[*id] - load[*id]))
        .collect();
    let mut out = Vec::new();
    for (owner, parts) in &movable {
        let excess = load[owner].saturating_sub(quota[owner]) as usize;
        // The newest partitions go first: a donor keeps its oldest assignments.
        for (t, p) in parts.iter().rev().take(excess) {
            if out.len() >= slots {
                return out;
            }
            deficit.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            // Anti-affinity (a preference, CLUSTER.md §9.2): a child partition goes to a
            // receiver other than the owner of its parent's partition of the same index when one
            // has room.
            let parent_owner = t
                .parent
                .as_deref()
                .and_then(|name| state.topics.get(name))
                .and_then(|pt| (*p < pt.partitions).then(|| pt.owner_of(*p)).flatten());
            let pick = deficit
                .iter()
                .position(|d| d.1 > 0 && Some(d.0) != parent_owner)
                .or_else(|| deficit.iter().position(|d| d.1 > 0));
            let Some(d) = pick.map(|i| &mut deficit[i]) else {
                return out;
            };
            d.1 -= 1;
            out.push(PlannedMove {
                topic: t.name.clone(),
                id: t.id,
                partition: *p,
                source: (*owner).to_string(),
                target: d.0.to_string(),
            });
        }
    }
    out
}

fn topic_of<'a>(
    state: &'a mut MetaState,
    name: &str,
    id: Option<TopicId>,
) -> Result<&'a mut TopicMeta, MetaError> {
    match state.topics.get_mut(name) {
        Some(t) if id.is_none_or(|id| t.id == id) => Ok(t),
        _ => Err(MetaError::not_found(format!("topic {name:?} not found"))),
    }
}

fn no_move(name: &str, p: u32) -> MetaError {
    MetaError::conflict(format!(
        "no move in flight for partition {p} of topic {name:?}"
    ))
}

pub(crate) fn start_moves(
    state: &mut MetaState,
    moves: Vec<PlannedMove>,
    at_ms: u64,
) -> Result<MetaResponse, MetaError> {
    for m in moves {
        let target_ok = state
            .members
            .get(&m.target)
            .is_some_and(MemberMeta::receives);
        let Some(t) = state.topics.get_mut(&m.topic).filter(|t| t.id == m.id) else {
            continue;
        };
        if !target_ok
            || m.partition >= t.partitions
            || m.source == m.target
            || t.owner_of(m.partition) != Some(m.source.as_str())
            || t.moves.contains_key(&m.partition)
        {
            continue;
        }
        t.moves.insert(
            m.partition,
            MoveMeta {
                source: m.source,
                target: m.target,
                started_ms: at_ms,
                freeze: None,
            },
        );
    }
    Ok(MetaResponse::Done)
}

pub(crate) fn freeze(
    state: &mut MetaState,
    name: &str,
    id: TopicId,
    p: u32,
    target: &str,
    token: u64,
) -> Result<MetaResponse, MetaError> {
    let t = topic_of(state, name, Some(id))?;
    let owner = t.owner_of(p).map(str::to_string);
    match t.moves.get_mut(&p) {
        Some(m) if m.target == target && owner.as_deref() == Some(m.source.as_str()) => {
            m.freeze = Some(token);
            Ok(MetaResponse::Done)
        }
        Some(m) => Err(MetaError::conflict(format!(
            "partition {p} of topic {name:?} now moves to {:?}",
            m.target
        ))),
        None => Err(no_move(name, p)),
    }
}

pub(crate) fn unfreeze(
    state: &mut MetaState,
    name: &str,
    id: TopicId,
    p: u32,
    token: u64,
) -> Result<MetaResponse, MetaError> {
    let t = topic_of(state, name, Some(id))?;
    match t.moves.get_mut(&p) {
        Some(m) if m.freeze == Some(token) => {
            m.freeze = None;
            Ok(MetaResponse::Done)
        }
        _ => Err(MetaError::conflict(format!(
            "partition {p} of topic {name:?} is not under that freeze"
        ))),
    }
}

pub(crate) fn flip(
    state: &mut MetaState,
    name: &str,
    id: TopicId,
    p: u32,
    source: &str,
    target: &str,
    token: Option<u64>,
) -> Result<MetaResponse, MetaError> {
    let source_dead = state.members.get(source).is_none_or(|m| m.dead);
    let t = topic_of(state, name, Some(id))?;
    let Some(m) = t.moves.get(&p) else {
        return Err(no_move(name, p));
    };
    if t.owner_of(p) != Some(source) || m.source != source || m.target != target {
        return Err(MetaError::conflict(format!(
            "partition {p} of topic {name:?} is owned by {:?} and moves to {:?}",
            t.owner_of(p).unwrap_or(""),
            m.target
        )));
    }
    match token {
        Some(tok) if m.freeze != Some(tok) => {
            return Err(MetaError::conflict(format!(
                "partition {p} of topic {name:?} is not under that freeze"
            )))
        }
        None if !source_dead => {
            return Err(MetaError::conflict(format!(
                "force-promote of partition {p} of topic {name:?}: its source {source:?} is alive"
            )))
        }
        _ => {}
    }
    t.spell_out_owners();
    t.owners[p as usize] = target.to_string();
    t.moves.remove(&p);
    Ok(MetaResponse::Topic(t.clone()))
}

pub(crate) fn end_move(
    state: &mut MetaState,
    name: &str,
    p: u32,
    target: Option<&str>,
) -> Result<MetaResponse, MetaError> {
    let t = topic_of(state, name, None)?;
    if p >= t.partitions {
        return Err(MetaError::not_found(format!(
            "topic {name:?} has no partition {p}"
        )));
    }
    let owner = t.owner_of(p).unwrap_or("").to_string();
    match t.moves.get(&p) {
        Some(m) if target.is_none_or(|x| x == m.target) => {
            t.moves.remove(&p);
            Ok(MetaResponse::Topic(t.clone()))
        }
        Some(m) => Err(MetaError::conflict(format!(
            "partition {p} of topic {name:?} is owned by {owner:?} and now moves to {:?}",
            m.target
        ))),
        None => Err(MetaError::conflict(format!(
            "no move in flight for partition {p} of topic {name:?} (owner {owner:?})"
        ))),
    }
}

/// Partitions member `id` owns, and moves it is the source or target of.
pub fn member_load(state: &MetaState, id: &str) -> (u64, u64) {
    let mut owned = 0;
    let mut moves = 0;
    for t in state.topics.values() {
        owned += (0..t.partitions)
            .filter(|&p| t.owner_of(p) == Some(id))
            .count() as u64;
        moves += t
            .moves
            .values()
            .filter(|m| m.source == id || m.target == id)
            .count() as u64;
    }
    (owned, moves)
}

pub(crate) fn remove_member(
    state: &mut MetaState,
    id: &str,
    at_ms: u64,
) -> Result<MetaResponse, MetaError> {
    if !state.members.contains_key(id) {
        return Err(MetaError::not_found(format!("member {id:?} not found")));
    }
    let (owned, moves) = member_load(state, id);
    if owned > 0 || moves > 0 {
        return Err(MetaError::conflict(format!(
            "member {id:?} still owns {owned} partitions and is in {moves} moves"
        )));
    }
    state.members.remove(id);
    state.tombstones.insert(id.to_string(), at_ms);
    Ok(MetaResponse::Done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::apply::apply;

    fn member(id: &str) -> MemberMeta {
        MemberMeta {
            id: id.into(),
            addr: String::new(),
            cluster_addr: String::new(),
            heartbeat_ms: 1,
            dead: false,
            draining: false,
            backlog: 0,
        }
    }

    fn topic(name: &str, id: u64, partitions: u32, owners: &[&str]) -> TopicMeta {
        TopicMeta {
            name: name.into(),
            id: TopicId(id),
            partitions,
            retention_ms: 0,
            visibility_timeout_ms: 30_000,
            max_in_flight_per_partition: 1000,
            max_acked_ahead_per_partition: 1000,
            created_at_s: 1,
            owner: None,
            schemas: Vec::new(),
            parent: None,
            children: Vec::new(),
            attach_epoch: None,
            fanout_delay_ms: 0,
            attach_offsets: Vec::new(),
            owners: owners.iter().map(|s| s.to_string()).collect(),
            moves: BTreeMap::new(),
            remote: None,
        }
    }

    fn state(members: &[&str], topics: Vec<TopicMeta>) -> MetaState {
        MetaState {
            members: members.iter().map(|m| (m.to_string(), member(m))).collect(),
            topics: topics.into_iter().map(|t| (t.name.clone(), t)).collect(),
            ..MetaState::default()
        }
    }

    fn counts(s: &MetaState) -> BTreeMap<String, u64> {
        let mut c = BTreeMap::new();
        for t in s.topics.values() {
            for p in 0..t.partitions {
                let o = t
                    .moves
                    .get(&p)
                    .map_or(t.owner_of(p).unwrap(), |m| &m.target);
                *c.entry(o.to_string()).or_default() += 1;
            }
        }
        c
    }

    /// Applies plans tick after tick, flipping every started move, until the planner is quiet.
    fn converge(s: &mut MetaState) -> usize {
        let mut moved = 0;
        let mut index = s.applied_index;
        for _ in 0..100 {
            let p = plan(s);
            if p.is_empty() {
                return moved;
            }
            assert!(p.len() <= MAX_IN_FLIGHT_MOVES);
            index += 1;
            apply(
                s,
                index,
                MetaCommand::StartMoves {
                    moves: p.clone(),
                    at_ms: 5,
                },
            )
            .unwrap();
            for m in p {
                index += 1;
                apply(
                    s,
                    index,
                    MetaCommand::FreezeMove {
                        topic: m.topic.clone(),
                        id: m.id,
                        partition: m.partition,
                        target: m.target.clone(),
                        token: 9,
                    },
                )
                .unwrap();
                index += 1;
                apply(
                    s,
                    index,
                    MetaCommand::FlipOwner {
                        topic: m.topic,
                        id: m.id,
                        partition: m.partition,
                        source: m.source,
                        target: m.target,
                        token: Some(9),
                    },
                )
                .unwrap();
                moved += 1;
            }
        }
        panic!("the planner never went quiet");
    }

    #[test]
    fn a_joined_node_gets_its_share_with_the_fewest_moves() {
        // 3 nodes own 12 partitions (4 each); d joins: it needs 3, one from each.
        let mut s = state(
            &["a", "b", "c", "d"],
            vec![
                topic("t", 1, 6, &["a", "b", "c"]),
                topic("u", 2, 6, &["b", "c", "a"]),
            ],
        );
        let first = plan(&s);
        assert_eq!(first.len(), 3, "{first:?}");
        assert!(first.iter().all(|m| m.target == "d"));
        let sources: std::collections::BTreeSet<_> = first.iter().map(|m| &m.source).collect();
        assert_eq!(sources.len(), 3, "one from each donor: {first:?}");
        assert_eq!(converge(&mut s), 3);
        assert_eq!(
            counts(&s).values().copied().collect::<Vec<_>>(),
            vec![3, 3, 3, 3]
        );
        // A balanced cluster plans nothing.
        assert!(plan(&s).is_empty());
    }

    #[test]
    fn moves_in_flight_count_at_their_destination_and_cap_at_eight() {
        let owners = ["a", "b"];
        let mut s = state(&["a", "b", "c"], vec![topic("t", 1, 30, &owners)]);
        let p = plan(&s);
        assert_eq!(p.len(), MAX_IN_FLIGHT_MOVES, "capped: {p:?}");
        apply(&mut s, 1, MetaCommand::StartMoves { moves: p, at_ms: 1 }).unwrap();
        // The next tick tops up to the cap: 10 are needed in all, 8 run, 2 more come after.
        assert!(plan(&s).is_empty(), "no slot while 8 run");
        let t = s.topics.get_mut("t").unwrap();
        let (&first, _) = t.moves.iter().next().unwrap();
        t.moves.remove(&first);
        let again = plan(&s);
        assert_eq!(again.len(), 1, "{again:?}");
        assert!(!s.topics["t"].moves.contains_key(&again[0].partition));
        // 7 still run; 3 more are started and flipped until c holds its 10.
        assert_eq!(converge(&mut s), 3);
        assert_eq!(
            counts(&s).values().copied().collect::<Vec<_>>(),
            vec![10, 10, 10]
        );
    }

    #[test]
    fn draining_members_shed_everything_and_dead_owners_keep_theirs() {
        let mut s = state(
            &["a", "b", "c", "d"],
            vec![topic("t", 1, 8, &["a", "b", "c", "d"])],
        );
        s.members.get_mut("d").unwrap().draining = true;
        s.members.get_mut("c").unwrap().dead = true;
        converge(&mut s);
        let c = counts(&s);
        assert_eq!(c.get("d"), None, "draining keeps nothing: {c:?}");
        assert_eq!(c["c"], 2, "a dead owner's partitions stay: {c:?}");
        assert_eq!((c["a"], c["b"]), (3, 3), "{c:?}");
        // A draining member is never a target, and with no receiver nothing is planned.
        for m in s.members.values_mut() {
            m.draining = true;
        }
        assert!(plan(&s).is_empty());
    }

    #[test]
    fn a_child_partition_moves_away_from_its_parent_partition_when_it_can() {
        // a owns 7 partitions, x 1, y none: x and y each need 2 (x sorts first on the tie). The
        // first to move is child partition 3, whose parent partition 3 x owns: it goes to y.
        let mut parent = topic("j", 1, 4, &["a", "a", "a", "x"]);
        parent.children = vec!["k".into()];
        let mut child = topic("k", 2, 4, &["a"]);
        child.parent = Some("j".into());
        child.attach_epoch = Some("0000000000000001".into());
        child.attach_offsets = vec![0; 4];
        let s = state(&["a", "x", "y"], vec![parent, child]);
        let plan = plan(&s);
        let k3 = plan
            .iter()
            .find(|m| m.topic == "k" && m.partition == 3)
            .expect("child partition 3 moves");
        assert_eq!(
            k3.target, "y",
            "away from parent partition 3's owner: {plan:?}"
        );
        // Balance still wins: x gets its two.
        assert_eq!(
            plan.iter().filter(|m| m.target == "x").count(),
            2,
            "{plan:?}"
        );
    }

    #[test]
    fn the_flip_is_a_compare_and_swap() {
        let mut s = state(&["a", "b"], vec![topic("t", 1, 4, &["a", "a"])]);
        let mv = |p| PlannedMove {
            topic: "t".into(),
            id: TopicId(1),
            partition: p,
            source: "a".into(),
            target: "b".into(),
        };
        apply(
            &mut s,
            1,
            MetaCommand::StartMoves {
                moves: vec![mv(1)],
                at_ms: 7,
            },
        )
        .unwrap();
        assert_eq!(s.topics["t"].moves[&1].started_ms, 7);
        let flip = |token| MetaCommand::FlipOwner {
            topic: "t".into(),
            id: TopicId(1),
            partition: 1,
            source: "a".into(),
            target: "b".into(),
            token,
        };
        // Not frozen: no flip; force-promote needs a dead source.
        assert!(apply(&mut s, 2, flip(Some(3))).is_err());
        assert!(apply(&mut s, 3, flip(None)).is_err());
        let freeze = |token| MetaCommand::FreezeMove {
            topic: "t".into(),
            id: TopicId(1),
            partition: 1,
            target: "b".into(),
            token,
        };
        apply(&mut s, 4, freeze(3)).unwrap();
        assert!(s.topics["t"].frozen(1));
        // The freeze expires; a flip naming it fails, a new freeze's flip succeeds.
        let unfreeze = MetaCommand::Unfreeze {
            topic: "t".into(),
            id: TopicId(1),
            partition: 1,
            token: 3,
        };
        apply(&mut s, 5, unfreeze).unwrap();
        assert!(apply(&mut s, 6, flip(Some(3))).is_err());
        apply(&mut s, 7, freeze(4)).unwrap();
        let before = s.topics_version;
        let Ok(MetaResponse::Topic(t)) = apply(&mut s, 8, flip(Some(4))) else {
            panic!("flip refused")
        };
        assert_eq!(t.owners, vec!["a", "b", "a", "a"], "spelt out, one changed");
        assert!(t.moves.is_empty());
        assert_eq!(s.topics_version, before + 1);
        // Replayed: the owner is no longer the source.
        assert!(apply(&mut s, 9, flip(Some(4))).is_err());
        // Force-promote with a dead source.
        apply(
            &mut s,
            10,
            MetaCommand::StartMoves {
                moves: vec![mv(0)],
                at_ms: 8,
            },
        )
        .unwrap();
        s.members.get_mut("a").unwrap().dead = true;
        let force = MetaCommand::FlipOwner {
            topic: "t".into(),
            id: TopicId(1),
            partition: 0,
            source: "a".into(),
            target: "b".into(),
            token: None,
        };
        apply(&mut s, 11, force).unwrap();
        assert_eq!(s.topics["t"].owner_of(0), Some("b"));
    }

    #[test]
    fn abort_and_removal_of_a_member() {
        let mut s = state(&["a", "b", "c"], vec![topic("t", 1, 3, &["a", "b", "c"])]);
        let mv = PlannedMove {
            topic: "t".into(),
            id: TopicId(1),
            partition: 2,
            source: "c".into(),
            target: "a".into(),
        };
        apply(
            &mut s,
            1,
            MetaCommand::StartMoves {
                moves: vec![mv],
                at_ms: 1,
            },
        )
        .unwrap();
        let end = |target: &str| MetaCommand::EndMove {
            topic: "t".into(),
            partition: 2,
            target: Some(target.into()),
        };
        let e = apply(&mut s, 2, end("b")).unwrap_err();
        assert_eq!(e.kind, MetaErrorKind::Conflict);
        apply(&mut s, 3, end("a")).unwrap();
        assert_eq!(
            apply(&mut s, 4, end("a")).unwrap_err().kind,
            MetaErrorKind::Conflict
        );
        // c owns partition 2: not removable; once it owns nothing it is, and stays out.
        let rm = MetaCommand::RemoveMember {
            id: "c".into(),
            at_ms: 9,
        };
        assert_eq!(
            apply(&mut s, 5, rm.clone()).unwrap_err().kind,
            MetaErrorKind::Conflict
        );
        s.topics.get_mut("t").unwrap().owners = vec!["a".into(), "b".into(), "a".into()];
        apply(&mut s, 6, rm).unwrap();
        assert!(!s.members.contains_key("c"));
        assert_eq!(s.tombstones["c"], 9);
        let hb = MetaCommand::Heartbeat {
            id: "c".into(),
            addr: String::new(),
            cluster_addr: String::new(),
            at_ms: 10,
            backlog: 0,
        };
        assert_eq!(
            apply(&mut s, 7, hb).unwrap_err().kind,
            MetaErrorKind::Forbidden
        );
        assert!(!s.members.contains_key("c"));
    }
}
