//! Membership (CLUSTER.md §6), run by shard 0 of a cluster node: this node's heartbeat through
//! the leader every 5 s, and, while this node leads, the verdicts: a member not heard for 30 s
//! (on the leader's clock, and never within 30 s of this node's election) is marked dead,
//! unless that would leave fewer alive voters than a quorum (the dead-marking breaker). A dead
//! member's next heartbeat revives it.
//!
//! Also the Raft view the other shards read (leader, voters) for `/v1/cluster/members`.

use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use narad_io::rt;
use narad_io::types::{MemberId, UnixMillis};
use narad_raft::{MetaCommand, MetaState};

use super::*;

/// Heartbeat period (CLUSTER.md §6).
pub const HEARTBEAT_MS: u64 = 5_000;
/// A member unheard this long is dead (CLUSTER.md §6).
pub const DEAD_AFTER_MS: u64 = 30_000;
/// Join attempts of a node outside the voters (CLUSTER.md §7: every 2 s).
const JOIN_RETRY: Duration = Duration::from_secs(2);
/// Leader addresses a joiner remembers from answers (CLUSTER.md §7).
const JOIN_HINTS_MAX: usize = 8;
/// How long a leader must have led before it promotes non-voters (CLUSTER.md §7: 12 s).
pub const PROMOTE_AFTER_MS: u64 = 12_000;
/// A non-voter this close to the leader's log counts as caught up.
const PROMOTE_LAG_ENTRIES: u64 = 16;

/// How often shard 0 publishes the Raft view and, leading, looks for dead members (more often
/// than CLUSTER.md §14's 10 s reconcile: a verdict then lands within a second of being due).
const LOOK_EVERY: Duration = Duration::from_secs(1);

/// The Raft view shard 0 last published: leader id, voters, non-voters.
#[derive(Clone, Debug, Default)]
pub struct RaftView {
    pub leader: Option<String>,
    pub voters: Vec<String>,
    pub learners: Vec<String>,
}

/// The API address other nodes and operators reach this node at: `http.addr`, with a wildcard
/// or missing host replaced by the advertised cluster address's host.
pub fn advertised_api_addr(config: &crate::config::Config) -> String {
    let api = &config.http.addr;
    let (host, port) = api.rsplit_once(':').unwrap_or(("", api.as_str()));
    if !host.is_empty() && host != "0.0.0.0" && host != "[::]" {
        return api.clone();
    }
    let cluster = config.advertised_cluster_addr();
    let chost = cluster
        .rsplit_once(':')
        .map_or(cluster.as_str(), |(h, _)| h);
    format!("{chost}:{port}")
}

/// Which members to mark dead now: alive, unheard for longer than `dead_after_ms` at `now_ms`,
/// unless marking them leaves fewer alive voters than a quorum of `voters` (then none; the
/// caller counts the refusal). Pure, for the leader's reconcile.
pub fn dead_verdict(
    meta: &MetaState,
    voters: &[String],
    now_ms: u64,
    dead_after_ms: u64,
) -> Result<Vec<String>, Vec<String>> {
    let late: Vec<String> = meta
        .members
        .values()
        .filter(|m| !m.dead && now_ms.saturating_sub(m.heartbeat_ms) > dead_after_ms)
        .map(|m| m.id.clone())
        .collect();
    if late.is_empty() {
        return Ok(late);
    }
    let alive_voters = voters
        .iter()
        .filter(|v| {
            meta.members
                .get(*v)
                .is_none_or(|m| !m.dead && !late.contains(&m.id))
        })
        .count();
    if alive_voters < voters.len() / 2 + 1 {
        return Err(late);
    }
    Ok(late)
}

impl Node {
    /// Whether member `m` is marked dead.
    pub fn member_dead(&self, m: MemberId) -> bool {
        self.meta
            .borrow()
            .members
            .values()
            .any(|x| x.dead && MemberId::of(&x.id) == m)
    }

    /// The Raft view shard 0 last published.
    pub fn raft_view(&self) -> RaftView {
        self.wide.raft_view()
    }

    /// Heartbeats failed in a row and the Unix milliseconds of the last one recorded.
    pub fn heartbeats(&self) -> (u64, Option<u64>) {
        self.wide.heartbeats()
    }

    /// Members the breaker refused to mark dead at the leader's last look.
    pub fn dead_marking_refused(&self) -> u64 {
        self.wide.dead_marking_refused()
    }

    /// Shard 0 of a cluster: heartbeats, the leader's verdicts, the published Raft view.
    pub(super) fn run_membership(self: &Rc<Self>) {
        let Some(mn) = self.meta_node.clone() else {
            return;
        };
        let heartbeat = Duration::from_millis(
            crate::config::test_knob("NARAD_TEST_HEARTBEAT_MS").unwrap_or(HEARTBEAT_MS),
        );
        let dead_after =
            crate::config::test_knob("NARAD_TEST_DEAD_AFTER_MS").unwrap_or(DEAD_AFTER_MS);
        let me = self.clone();
        rt::spawn(async move {
            while !me.shutting_down() {
                let cmd = MetaCommand::Heartbeat {
                    id: me.config.node_id.clone(),
                    addr: advertised_api_addr(&me.config),
                    cluster_addr: me.config.advertised_cluster_addr(),
                    at_ms: UnixMillis::now().0,
                    backlog: me.wide.transit.backlog(),
                };
                let r = me.propose(cmd).await;
                me.wide.note_heartbeat(r.is_ok());
                if let Err(e) = r {
                    tracing::debug!(error = %e, "heartbeat not recorded");
                }
                rt::sleep(heartbeat).await;
            }
        })
        .detach();
        if !self
            .config
            .peers
            .iter()
            .any(|p| p.id == self.config.node_id)
        {
            self.run_join_loop(mn.clone());
        }
        let promote_after =
            crate::config::test_knob("NARAD_TEST_PROMOTE_AFTER_MS").unwrap_or(PROMOTE_AFTER_MS);
        let me = self.clone();
        rt::spawn(async move {
            let mut led_since: Option<Instant> = None;
            let mut leader_moves = super::moves::LeaderMoves::new();
            while !me.shutting_down() {
                let (leader, voters, learners) = mn.raft_view();
                let leads = mn.is_leader();
                me.wide.set_raft_view(RaftView {
                    leader,
                    voters: voters.clone(),
                    learners,
                });
                led_since = match (leads, led_since) {
                    (true, None) => Some(Instant::now()),
                    (true, s) => s,
                    (false, _) => None,
                };
                if led_since.is_some_and(|t| t.elapsed().as_millis() as u64 >= promote_after) {
                    // Promote non-voters whose member record is alive (and not draining).
                    let meta = mn.state();
                    let alive = |id: &str| meta.members.get(id).is_some_and(|m| m.receives());
                    mn.promote_caught_up(alive, PROMOTE_LAG_ENTRIES).await;
                    // Moves (CLUSTER.md §9.2) and decommissions (§10): a leader that has led
                    // long enough to know every member's state.
                    leader_moves.tick(&me, &mn.state()).await;
                    me.decommission_step(&mn).await;
                } else {
                    me.wide.set_decommission_blocked(Vec::new());
                }
                // Election grace: every member gets a full `dead_after` from this election.
                let graced = led_since.is_some_and(|t| t.elapsed().as_millis() as u64 > dead_after);
                if !graced {
                    me.wide.set_dead_marking_refused(0);
                } else {
                    match dead_verdict(&mn.state(), &voters, UnixMillis::now().0, dead_after) {
                        Ok(ids) if ids.is_empty() => me.wide.set_dead_marking_refused(0),
                        Ok(ids) => {
                            me.wide.set_dead_marking_refused(0);
                            tracing::warn!(members = ?ids, "marking members dead: no heartbeat");
                            let _ = me.propose(MetaCommand::MarkDead { ids }).await;
                        }
                        Err(ids) => {
                            me.wide.set_dead_marking_refused(ids.len() as u64);
                            tracing::warn!(members = ?ids, "dead verdict refused: it would leave fewer alive voters than a quorum");
                        }
                    }
                }
                rt::sleep(LOOK_EVERY).await;
            }
        })
        .detach();
    }
}

/// Why a decommission cannot go on now (API.md §12.1 `decommission_blocked`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Blocked {
    pub node: String,
    pub code: &'static str,
    pub message: String,
}

impl Node {
    /// Leader: takes each draining member one step further (CLUSTER.md §10 step 3): once it
    /// owns nothing, is in no move and its dispatch backlog is 0, hands leadership away if it
    /// is this node, removes it from the Raft configuration (never below 3 voters), then writes
    /// its removal (record deleted, tombstone left). Publishes what blocks each.
    async fn decommission_step(self: &Rc<Self>, mn: &narad_raft::MetaNode) {
        let meta = mn.state();
        let (_, voters, _) = mn.raft_view();
        let receivers = meta.members.values().filter(|m| m.receives()).count();
        let mut blocked = Vec::new();
        for m in meta.members.values().filter(|m| m.draining) {
            let block = |code: &'static str, message: String| Blocked {
                node: m.id.clone(),
                code,
                message,
            };
            let (owned, moves) = narad_raft::moves::member_load(&meta, &m.id);
            if owned > 0 || moves > 0 {
                if receivers == 0 {
                    blocked.push(block(
                        "no_receivers",
                        "every live member is being decommissioned, so no member can take its partitions".into(),
                    ));
                } else {
                    blocked.push(block(
                        "move_target",
                        format!("{owned} partitions still owned, {moves} moves in flight"),
                    ));
                }
                continue;
            }
            if m.backlog > 0 {
                blocked.push(block(
                    "dispatch_backlog",
                    format!(
                        "{} accepted records not yet handed to their owners",
                        m.backlog
                    ),
                ));
                continue;
            }
            if m.id == self.config.node_id {
                blocked.push(block(
                    "leader_transfer",
                    "the node leads the metadata group; handing leadership over".into(),
                ));
                mn.transfer_leadership(Duration::from_secs(5)).await;
                continue;
            }
            match mn.remove_server(&m.id).await {
                Ok(true) => {}
                Ok(false) => {
                    blocked.push(block(
                        "below_min_voters",
                        format!(
                            "removing it would leave fewer than 3 voters ({} now)",
                            voters.len()
                        ),
                    ));
                    continue;
                }
                Err(e) => {
                    tracing::warn!(node = m.id, error = %e, "removing a decommissioned member from Raft failed");
                    continue;
                }
            }
            let removed = self
                .propose(MetaCommand::RemoveMember {
                    id: m.id.clone(),
                    at_ms: UnixMillis::now().0,
                })
                .await;
            match removed {
                Ok(_) => tracing::info!(node = m.id, "decommission finished: member removed"),
                Err(e) => {
                    tracing::warn!(node = m.id, error = %e, "writing a member's removal failed")
                }
            }
        }
        self.wide.set_decommission_blocked(blocked);
    }

    /// What blocks each decommission, as the leader's last look saw it (empty elsewhere).
    pub fn decommission_blocked(&self) -> Vec<Blocked> {
        self.wide.decommission_blocked()
    }

    /// A node outside the voters: every [`JOIN_RETRY`] until its Raft sees a leader, asks the
    /// peers (and leaders named in earlier answers) to admit it.
    fn run_join_loop(self: &Rc<Self>, mn: narad_raft::MetaNode) {
        let me = self.clone();
        rt::spawn(async move {
            let my_addr = me.config.advertised_cluster_addr();
            let mut hints: Vec<String> = Vec::new();
            while !me.shutting_down() {
                if mn.has_leader() {
                    rt::sleep(JOIN_RETRY).await;
                    continue;
                }
                let mut targets: Vec<String> = hints.iter().rev().take(4).cloned().collect();
                targets.extend(me.config.peers.iter().map(|p| p.addr.clone()));
                targets.dedup();
                for addr in targets {
                    match mn.ask_to_join(&addr, &my_addr).await {
                        Ok(narad_raft::JoinAnswer::NotLeader {
                            leader_addr: Some(a),
                            ..
                        }) => {
                            hints.retain(|h| *h != a);
                            hints.push(a);
                            if hints.len() > JOIN_HINTS_MAX {
                                hints.remove(0);
                            }
                        }
                        Ok(narad_raft::JoinAnswer::Staged | narad_raft::JoinAnswer::Voter) => {
                            tracing::info!(via = %addr, "admitted to the cluster");
                            break;
                        }
                        Ok(narad_raft::JoinAnswer::Refused(why)) => {
                            tracing::warn!(via = %addr, why, "join refused");
                        }
                        Ok(_) => {}
                        Err(e) => tracing::debug!(via = %addr, error = %e, "join attempt failed"),
                    }
                }
                rt::sleep(JOIN_RETRY).await;
            }
        })
        .detach();
    }
}

impl NodeWide {
    fn set_decommission_blocked(&self, b: Vec<Blocked>) {
        *self
            .decommission_blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = b;
    }

    fn decommission_blocked(&self) -> Vec<Blocked> {
        self.decommission_blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn set_raft_view(&self, v: RaftView) {
        *self.raft_view.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(v);
    }

    pub fn raft_view(&self) -> RaftView {
        (**self.raft_view.lock().unwrap_or_else(|e| e.into_inner())).clone()
    }

    /// The leader's last look: `n` members it would mark dead but the breaker refused.
    pub fn set_dead_marking_refused(&self, n: u64) {
        self.dead_marking_refused.store(n, Ordering::Relaxed);
    }

    /// Members the breaker refused to mark dead at the leader's last look
    /// (`narad_dead_marking_refused`).
    pub fn dead_marking_refused(&self) -> u64 {
        self.dead_marking_refused.load(Ordering::Relaxed)
    }

    /// A heartbeat was recorded by the leader (`ok`) or failed.
    pub fn note_heartbeat(&self, ok: bool) {
        if ok {
            self.heartbeat_failures.store(0, Ordering::Relaxed);
            self.heartbeat_ok_ms
                .store(UnixMillis::now().0, Ordering::Relaxed);
        } else {
            self.heartbeat_failures.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Heartbeats failed in a row, and the Unix milliseconds of the last one recorded (if any).
    pub fn heartbeats(&self) -> (u64, Option<u64>) {
        let ok = self.heartbeat_ok_ms.load(Ordering::Relaxed);
        (
            self.heartbeat_failures.load(Ordering::Relaxed),
            (ok > 0).then_some(ok),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use narad_raft::MemberMeta;

    fn state(members: &[(&str, u64, bool)]) -> MetaState {
        let mut s = MetaState::default();
        for (id, hb, dead) in members {
            s.members.insert(
                id.to_string(),
                MemberMeta {
                    id: id.to_string(),
                    addr: String::new(),
                    cluster_addr: String::new(),
                    heartbeat_ms: *hb,
                    dead: *dead,
                    draining: false,
                    backlog: 0,
                },
            );
        }
        s
    }

    #[test]
    fn a_wildcard_api_address_is_advertised_with_the_cluster_host() {
        // Proves the members route shows an address others can reach: a wildcard or missing
        // host of `http.addr` takes the advertised cluster address's host; a real one stays.
        let mut c = crate::config::Config {
            advertise_addr: "narad-1.narad-headless.ns.svc:7943".into(),
            ..Default::default()
        };
        c.http.addr = ":7942".into();
        assert_eq!(
            advertised_api_addr(&c),
            "narad-1.narad-headless.ns.svc:7942"
        );
        c.http.addr = "0.0.0.0:8000".into();
        assert_eq!(
            advertised_api_addr(&c),
            "narad-1.narad-headless.ns.svc:8000"
        );
        c.http.addr = "10.1.2.3:7942".into();
        assert_eq!(advertised_api_addr(&c), "10.1.2.3:7942");
    }

    #[test]
    fn dead_verdicts_follow_the_clock_and_the_breaker() {
        // Proves CLUSTER.md §6: a member unheard for more than 30 s is judged dead, a recent
        // one is not, one already dead is not judged again, and the breaker refuses a verdict
        // that would leave fewer alive voters than a quorum.
        let voters: Vec<String> = ["a", "b", "c"].iter().map(|s| s.to_string()).collect();
        let now = 100_000;
        let s = state(&[
            ("a", now - 1_000, false),
            ("b", now - 31_000, false),
            ("c", now, false),
        ]);
        assert_eq!(
            dead_verdict(&s, &voters, now, 30_000),
            Ok(vec!["b".to_string()])
        );
        let s = state(&[
            ("a", now, false),
            ("b", now - 29_000, false),
            ("c", now, false),
        ]);
        assert_eq!(dead_verdict(&s, &voters, now, 30_000), Ok(vec![]));
        let s = state(&[
            ("a", now, false),
            ("b", 0, true),
            ("c", now - 40_000, false),
        ]);
        assert_eq!(
            dead_verdict(&s, &voters, now, 30_000),
            Err(vec!["c".to_string()]),
            "b dead and c late would leave one alive voter of three"
        );
    }
}
