//! Unit tests of the metadata state transition.

use narad_io::types::TopicId;
use serde_json::json;

use super::*;

fn topic(name: &str, id: u64) -> TopicMeta {
    TopicMeta {
        name: name.to_string(),
        id: TopicId(id),
        partitions: 3,
        retention_ms: 604_800_000,
        visibility_timeout_ms: 30_000,
        max_in_flight_per_partition: 1024,
        max_acked_ahead_per_partition: 1024,
        created_at_s: 1_790_623_903,
        owner: Some("alice".to_string()),
        schemas: Vec::new(),
        parent: None,
        children: Vec::new(),
        attach_epoch: None,
        fanout_delay_ms: 0,
        attach_offsets: Vec::new(),
        owners: Vec::new(),
        moves: Default::default(),
        remote: None,
    }
}

/// Applies with consecutive indexes.
struct Log {
    state: MetaState,
    index: u64,
}

impl Log {
    fn new() -> Log {
        Log {
            state: MetaState::default(),
            index: 0,
        }
    }
    fn run(&mut self, cmd: MetaCommand) -> Result<MetaResponse, MetaError> {
        self.index += 1;
        let out = apply(&mut self.state, self.index, cmd);
        assert_eq!(self.state.applied_index, self.index);
        check_invariants(&self.state).expect("invariants hold after every command");
        out
    }
    fn ok(&mut self, cmd: MetaCommand) -> MetaResponse {
        self.run(cmd).expect("command succeeds")
    }
    fn err(&mut self, cmd: MetaCommand) -> MetaError {
        let before = self.state.clone();
        let e = self.run(cmd).expect_err("command is refused");
        let mut after = self.state.clone();
        after.applied_index = before.applied_index;
        assert_eq!(
            before, after,
            "a refused command changes nothing but applied_index"
        );
        e
    }
    fn t(&self, name: &str) -> &TopicMeta {
        self.state.topics.get(name).expect("topic exists")
    }
}

fn attach(parent: &str, child: &str, delay_ms: u64, offsets: Vec<u64>) -> MetaCommand {
    MetaCommand::AttachChild {
        parent: parent.to_string(),
        parent_id: None,
        child: child.to_string(),
        child_id: None,
        delay_ms,
        attach_epoch: "341e6b8a37a9688a".to_string(),
        attach_offsets: offsets,
    }
}

fn alter(name: &str, id: u64) -> MetaCommand {
    MetaCommand::AlterTopic {
        name: name.to_string(),
        id: TopicId(id),
        retention_ms: None,
        max_in_flight_per_partition: None,
        max_acked_ahead_per_partition: None,
        partitions: None,
        schema: None,
        schema_base_version: None,
    }
}

fn with_schema(cmd: MetaCommand, s: serde_json::Value, base: Option<u32>) -> MetaCommand {
    match cmd {
        MetaCommand::AlterTopic { name, id, .. } => MetaCommand::AlterTopic {
            name,
            id,
            retention_ms: None,
            max_in_flight_per_partition: None,
            max_acked_ahead_per_partition: None,
            partitions: None,
            schema: Some(s),
            schema_base_version: base,
        },
        other => other,
    }
}

#[test]
fn create_refuses_duplicates_and_case_collisions() {
    // Proves create stores the topic, answers 409 `topic already exists` for the same name and a
    // 409 naming the existing topic for a case-only collision, and bumps topics_version only on
    // success.
    let mut log = Log::new();
    assert!(matches!(
        log.ok(MetaCommand::CreateTopic(topic("orders", 1))),
        MetaResponse::Topic(_)
    ));
    assert_eq!(log.state.topics_version, 1);
    let e = log.err(MetaCommand::CreateTopic(topic("orders", 2)));
    assert_eq!(
        (e.kind, e.message.as_str()),
        (MetaErrorKind::Conflict, "topic already exists")
    );
    let e = log.err(MetaCommand::CreateTopic(topic("Orders", 3)));
    assert_eq!(e.kind, MetaErrorKind::Conflict);
    assert!(
        e.message.contains("differs only in letter case"),
        "{}",
        e.message
    );
    assert!(e.message.contains("\"orders\""), "{}", e.message);
    let e = log.err(MetaCommand::CreateTopic(topic("other", 1)));
    assert_eq!(e.kind, MetaErrorKind::Conflict, "id collision is refused");
    assert_eq!(log.state.topics_version, 1);
}

#[test]
fn create_validates_fields_with_spec_messages() {
    // Proves the field checks of API.md §6.1 that apply repeats: partition bounds (the configured
    // topic.max_partitions is the proposer's; apply holds the hard ceiling), retention
    // minimum (0 = forever allowed), delay without parent, bad names.
    let mut log = Log::new();
    let mut t = topic("a", 1);
    t.partitions = 2;
    let e = log.err(MetaCommand::CreateTopic(t));
    assert_eq!(
        e.message,
        "invalid argument: partitions must be >= 3 (0 = use default)"
    );
    let mut t = topic("a", 1);
    t.partitions = PARTITIONS_HARD_MAX + 1;
    let e = log.err(MetaCommand::CreateTopic(t));
    assert_eq!(
        e.message,
        "invalid argument: partitions (4097) exceeds the hard limit of 4096"
    );
    let mut t = topic("a", 1);
    t.retention_ms = 5;
    let e = log.err(MetaCommand::CreateTopic(t));
    assert_eq!(
        e.message,
        "invalid argument: retention_ms (5) is below the minimum of 3600000 (1 hour)"
    );
    let mut t = topic("a", 1);
    t.fanout_delay_ms = 10;
    let e = log.err(MetaCommand::CreateTopic(t));
    assert_eq!(
        e.message,
        "invalid argument: fanout_delay_ms requires parent"
    );
    for bad in ["", ".", "..", "a/b", "a b", &"x".repeat(201)] {
        let e = log.err(MetaCommand::CreateTopic(topic(bad, 9)));
        assert_eq!(e.kind, MetaErrorKind::Invalid, "{bad:?}");
    }
    let mut t = topic("forever", 1);
    t.retention_ms = 0;
    log.ok(MetaCommand::CreateTopic(t));
    let mut t = topic("bad-schema", 2);
    t.schemas = vec![json!(false)];
    assert_eq!(
        log.err(MetaCommand::CreateTopic(t)).kind,
        MetaErrorKind::Invalid
    );
}

#[test]
fn delete_checks_incarnation_and_detaches_links() {
    // Proves delete answers 404 for a missing topic and 409 for a stale incarnation id, and that
    // deleting a parent makes its children standalone while deleting a child unlinks it.
    let mut log = Log::new();
    let e = log.err(MetaCommand::DeleteTopic {
        name: "p".into(),
        id: TopicId(1),
    });
    assert_eq!(
        (e.kind, e.message.as_str()),
        (MetaErrorKind::NotFound, "topic not found")
    );
    log.ok(MetaCommand::CreateTopic(topic("p", 1)));
    log.ok(MetaCommand::CreateTopic(topic("c1", 2)));
    log.ok(MetaCommand::CreateTopic(topic("c2", 3)));
    log.ok(attach("p", "c1", 0, vec![0, 0, 0]));
    log.ok(attach("p", "c2", 0, vec![5, 6, 7]));
    let e = log.err(MetaCommand::DeleteTopic {
        name: "p".into(),
        id: TopicId(99),
    });
    assert_eq!(e.message, "topic changed since it was read");
    log.ok(MetaCommand::DeleteTopic {
        name: "c1".into(),
        id: TopicId(2),
    });
    assert_eq!(log.t("p").children, vec!["c2".to_string()]);
    log.ok(MetaCommand::DeleteTopic {
        name: "p".into(),
        id: TopicId(1),
    });
    let c2 = log.t("c2");
    assert_eq!(c2.role(), Role::Standalone);
    assert!(c2.attach_epoch.is_none() && c2.attach_offsets.is_empty());
}

#[test]
fn alter_applies_fields_and_refuses_with_spec_messages() {
    // Proves PATCH rules of API.md §6.4: empty change refused, partitions only grow, retention
    // minimum, caps > 0, all-or-nothing within one command, and the stale-id conflict.
    let mut log = Log::new();
    log.ok(MetaCommand::CreateTopic(topic("t", 7)));
    let e = log.err(alter("t", 7));
    assert_eq!(
        e.message,
        "at least one of partitions, retention_ms, max_*_per_partition, or schema is required"
    );
    let MetaCommand::AlterTopic { name, id, .. } = alter("t", 7) else {
        unreachable!()
    };
    let mk = |retention_ms, partitions, cap| MetaCommand::AlterTopic {
        name: name.clone(),
        id,
        retention_ms,
        max_in_flight_per_partition: cap,
        max_acked_ahead_per_partition: None,
        partitions,
        schema: None,
        schema_base_version: None,
    };
    let e = log.err(mk(None, Some(3), None));
    assert_eq!(
        e.message,
        "invalid argument: new partition count (3) must be greater than current (3); decrease is not supported"
    );
    let e = log.err(mk(None, Some(5000), None));
    assert_eq!(
        e.message,
        "invalid argument: partitions (5000) exceeds the hard limit of 4096"
    );
    // A bad later field refuses the whole command: retention stays.
    let e = log.err(mk(Some(0), Some(2), None));
    assert_eq!(e.kind, MetaErrorKind::Invalid);
    assert_eq!(log.t("t").retention_ms, 604_800_000);
    assert_eq!(
        log.err(mk(None, None, Some(0))).kind,
        MetaErrorKind::Invalid
    );
    let MetaResponse::Topic(after) = log.ok(mk(Some(0), Some(6), Some(10))) else {
        panic!()
    };
    assert_eq!(
        (
            after.retention_ms,
            after.partitions,
            after.max_in_flight_per_partition
        ),
        (0, 6, 10)
    );
    let e = log.err(alter("t", 8));
    assert_eq!(e.message, "topic changed since it was read");
    let e = log.err(alter("missing", 8));
    assert_eq!(e.kind, MetaErrorKind::NotFound);
}

#[test]
fn schema_versions_append_conditionally_and_reach_children() {
    // Proves schema registration (SEMANTICS.md §8.4–8.5): versions append, an identical document
    // registers nothing, schema_base_version guards races, a parent change reaches its attached
    // child in the same write, and an attached child cannot change its own schema.
    let mut log = Log::new();
    log.ok(MetaCommand::CreateTopic(topic("p", 1)));
    log.ok(MetaCommand::CreateTopic(topic("c", 2)));
    log.ok(with_schema(
        alter("p", 1),
        json!({"type":"object"}),
        Some(0),
    ));
    assert_eq!(log.t("p").schema_version(), 1);
    log.ok(with_schema(alter("p", 1), json!({"type":"object"}), None));
    assert_eq!(
        log.t("p").schema_version(),
        1,
        "identical schema registers nothing"
    );
    let e = log.err(with_schema(alter("p", 1), json!({}), Some(0)));
    assert_eq!(
        (e.kind, e.message.as_str()),
        (MetaErrorKind::Conflict, "schema version conflict")
    );
    assert_eq!(
        log.err(with_schema(alter("p", 1), json!(null), None)).kind,
        MetaErrorKind::Invalid
    );
    // The schema-less child adopts the parent's whole history on attach.
    log.ok(attach("p", "c", 0, vec![0, 0, 0]));
    assert_eq!(log.t("c").schemas, log.t("p").schemas);
    log.ok(with_schema(
        alter("p", 1),
        json!({"type":["object","string"]}),
        Some(1),
    ));
    assert_eq!(
        log.t("c").schema_version(),
        2,
        "parent change reaches the child"
    );
    let e = log.err(with_schema(alter("c", 2), json!({"x":1}), None));
    assert!(e
        .message
        .starts_with("schema is parent-managed while attached to a fan-out parent: "));
    // After detach the child keeps its history and may change it.
    log.ok(MetaCommand::DetachChild {
        parent: "p".into(),
        child: "c".into(),
    });
    assert_eq!(log.t("c").schema_version(), 2);
    log.ok(with_schema(alter("c", 2), json!({"x":1}), Some(2)));
    assert_eq!(log.t("c").schema_version(), 3);
}

#[test]
fn schema_history_is_bounded_at_1000_versions() {
    // Proves the 1000-version limit answers 409 and the 1000th version is still accepted.
    let mut log = Log::new();
    log.ok(MetaCommand::CreateTopic(topic("t", 1)));
    for v in 0..SCHEMA_VERSIONS_MAX {
        log.ok(with_schema(
            alter("t", 1),
            json!({"minProperties": v}),
            None,
        ));
    }
    assert_eq!(log.t("t").schema_version() as usize, SCHEMA_VERSIONS_MAX);
    let e = log.err(with_schema(
        alter("t", 1),
        json!({"minProperties": 5000}),
        None,
    ));
    assert_eq!(e.kind, MetaErrorKind::Conflict);
}

#[test]
fn attach_enforces_roles_limits_schemas_and_delay() {
    // Proves the attach refusals of API.md §9.1 with their message prefixes: role conflicts,
    // already attached, 108 children, schema mismatch both ways, delay longer than the parent's
    // retention can buffer, and 404 for a missing topic.
    let mut log = Log::new();
    log.ok(MetaCommand::CreateTopic(topic("p", 1)));
    log.ok(MetaCommand::CreateTopic(topic("c", 2)));
    log.ok(MetaCommand::CreateTopic(topic("q", 3)));
    assert_eq!(
        log.err(attach("p", "nope", 0, vec![0; 3])).kind,
        MetaErrorKind::NotFound
    );
    assert_eq!(
        log.err(attach("p", "p", 0, vec![0; 3])).kind,
        MetaErrorKind::Invalid
    );
    log.ok(attach("p", "c", 0, vec![0; 3]));
    assert!(log
        .err(attach("p", "c", 0, vec![0; 3]))
        .message
        .starts_with("already exists: "));
    assert!(log
        .err(attach("q", "c", 0, vec![0; 3]))
        .message
        .starts_with("fan-out role conflict: "));
    assert!(log
        .err(attach("c", "q", 0, vec![0; 3]))
        .message
        .starts_with("fan-out role conflict: "));
    assert!(log
        .err(attach("q", "p", 0, vec![0; 3]))
        .message
        .starts_with("fan-out role conflict: "));
    // Wrong attach-point length means the parent changed since the proposer read it.
    assert_eq!(
        log.err(attach("p", "q", 0, vec![0; 2])).kind,
        MetaErrorKind::Conflict
    );
    // Delay: 7 d retention buffers 6 d but not 7 d.
    let e = log.err(attach("p", "q", 604_800_000, vec![0; 3]));
    assert_eq!(
        e.message,
        "delay exceeds what the parent's retention can buffer: parent \"p\" retention (604800000ms) must be at least delay (604800000ms) + 3600000ms"
    );
    log.ok(attach("p", "q", 518_400_000, vec![0; 3]));
    // Retention of the parent can no longer drop below the child's delay + 1 h.
    let MetaCommand::AlterTopic { name, id, .. } = alter("p", 1) else {
        unreachable!()
    };
    let e = log.err(MetaCommand::AlterTopic {
        name,
        id,
        retention_ms: Some(3_600_000),
        max_in_flight_per_partition: None,
        max_acked_ahead_per_partition: None,
        partitions: None,
        schema: None,
        schema_base_version: None,
    });
    assert!(e
        .message
        .starts_with("delay exceeds what the parent's retention can buffer: "));
    // Schemas: a schema'd child cannot go under a schema-less parent, nor under a different one.
    let mut s = topic("s", 10);
    s.schemas = vec![json!({"type":"object"})];
    log.ok(MetaCommand::CreateTopic(s));
    let e = log.err(attach("p", "s", 0, vec![0; 3]));
    assert!(
        e.message
            .starts_with("child schema incompatible with parent: "),
        "{}",
        e.message
    );
    let mut sp = topic("sp", 11);
    sp.schemas = vec![json!(true)];
    log.ok(MetaCommand::CreateTopic(sp));
    assert!(log
        .err(attach("sp", "s", 0, vec![0; 3]))
        .message
        .starts_with("child schema incompatible"));
    // Children limit.
    log.ok(MetaCommand::CreateTopic(topic("big", 100)));
    for i in 0..CHILDREN_MAX {
        log.ok(MetaCommand::CreateTopic(topic(
            &format!("k{i}"),
            1000 + i as u64,
        )));
        log.ok(attach("big", &format!("k{i}"), 0, vec![0; 3]));
    }
    log.ok(MetaCommand::CreateTopic(topic("one-more", 5000)));
    let e = log.err(attach("big", "one-more", 0, vec![0; 3]));
    assert!(e
        .message
        .starts_with("parent has reached the maximum number of children: "));
}

#[test]
fn create_with_parent_links_in_one_step_or_not_at_all() {
    // Proves create-as-child links child and parent atomically, adopts the parent's schema
    // history, grows children's attach offsets when the parent gains partitions, and that a
    // failing attach leaves no half-created topic.
    let mut log = Log::new();
    let mut p = topic("p", 1);
    p.schemas = vec![json!({"type":"object"})];
    log.ok(MetaCommand::CreateTopic(p));
    let mut c = topic("c", 2);
    c.parent = Some("p".into());
    c.attach_epoch = Some("00000000000000ff".into());
    c.attach_offsets = vec![1, 2, 3];
    let MetaResponse::Topic(ct) = log.ok(MetaCommand::CreateTopic(c)) else {
        panic!()
    };
    assert_eq!((ct.role(), ct.schema_version()), (Role::Child, 1));
    assert_eq!(log.t("p").children, vec!["c".to_string()]);
    let mut d = topic("d", 3);
    d.parent = Some("missing".into());
    d.attach_epoch = Some("00000000000000ff".into());
    d.attach_offsets = vec![0; 3];
    assert_eq!(
        log.err(MetaCommand::CreateTopic(d.clone())).kind,
        MetaErrorKind::NotFound
    );
    d.parent = Some("c".into());
    assert_eq!(
        log.err(MetaCommand::CreateTopic(d)).kind,
        MetaErrorKind::Conflict
    );
    assert!(log.state.topic("d").is_none());
    let MetaCommand::AlterTopic { name, id, .. } = alter("p", 1) else {
        unreachable!()
    };
    log.ok(MetaCommand::AlterTopic {
        name,
        id,
        retention_ms: None,
        max_in_flight_per_partition: None,
        max_acked_ahead_per_partition: None,
        partitions: Some(5),
        schema: None,
        schema_base_version: None,
    });
    assert_eq!(log.t("c").attach_offsets, vec![1, 2, 3, 0, 0]);
}

#[test]
fn detach_requires_a_link() {
    // Proves detach answers the spec's 404 text when the topics are not linked.
    let mut log = Log::new();
    log.ok(MetaCommand::CreateTopic(topic("p", 1)));
    log.ok(MetaCommand::CreateTopic(topic("c", 2)));
    let e = log.err(MetaCommand::DetachChild {
        parent: "p".into(),
        child: "c".into(),
    });
    assert_eq!(
        (e.kind, e.message.as_str()),
        (
            MetaErrorKind::NotFound,
            "not found: \"c\" is not attached to \"p\""
        )
    );
}

fn user(name: &str) -> UserMeta {
    UserMeta {
        username: name.to_string(),
        password_hash: "$2b$10$hash".to_string(),
        grants: vec![Grant {
            action: "produce".into(),
            patterns: vec!["orders-*".into()],
        }],
        root: false,
        created_at_ms: 1,
        updated_at_ms: 1,
    }
}

#[test]
fn users_and_root_rules() {
    // Proves user commands: create/duplicate, grant validation texts, the root admin's immutable
    // grants and undeletability, seeding only once, and that deleting a user clears topic
    // ownership; users_version moves only on success.
    let mut log = Log::new();
    log.ok(MetaCommand::SeedRoot {
        password_hash: "h".into(),
        created_at_ms: 5,
    });
    assert!(log.state.user("admin").is_some_and(|u| u.root));
    assert_eq!(
        log.err(MetaCommand::SeedRoot {
            password_hash: "h".into(),
            created_at_ms: 6
        })
        .kind,
        MetaErrorKind::Conflict
    );
    log.ok(MetaCommand::CreateUser(user("alice")));
    let v = log.state.users_version;
    assert_eq!(
        log.err(MetaCommand::CreateUser(user("alice"))).message,
        "user already exists"
    );
    assert_eq!(log.state.users_version, v);
    let e = log.err(MetaCommand::CreateUser(user("bad name")));
    assert_eq!(e.message, "username must match ^[A-Za-z0-9._-]{1,64}$");
    let cases = [
        (
            Grant {
                action: "x".into(),
                patterns: vec![],
            },
            "unknown grant action \"x\"",
        ),
        (
            Grant {
                action: "produce".into(),
                patterns: vec![],
            },
            "grant \"produce\" requires at least one topic pattern",
        ),
        (
            Grant {
                action: "admin".into(),
                patterns: vec!["a".into()],
            },
            "admin grants are global and must not carry patterns",
        ),
    ];
    for (g, msg) in cases {
        let e = log.err(MetaCommand::SetGrants {
            username: "alice".into(),
            grants: vec![g],
            updated_at_ms: 9,
        });
        assert_eq!(e.message, msg);
    }
    for bad in ["", "a*b", "**"] {
        let g = Grant {
            action: "consume".into(),
            patterns: vec![bad.into()],
        };
        let e = log.err(MetaCommand::SetGrants {
            username: "alice".into(),
            grants: vec![g],
            updated_at_ms: 9,
        });
        assert_eq!(e.kind, MetaErrorKind::Invalid, "{bad:?}");
    }
    let g = Grant {
        action: "consume".into(),
        patterns: vec!["*".into(), "orders".into()],
    };
    let MetaResponse::User(u) = log.ok(MetaCommand::SetGrants {
        username: "alice".into(),
        grants: vec![g],
        updated_at_ms: 9,
    }) else {
        panic!()
    };
    assert_eq!(u.updated_at_ms, 9);
    let e = log.err(MetaCommand::SetGrants {
        username: "admin".into(),
        grants: vec![],
        updated_at_ms: 9,
    });
    assert_eq!(
        (e.kind, e.message.as_str()),
        (
            MetaErrorKind::Forbidden,
            "the root admin's grants are immutable"
        )
    );
    let e = log.err(MetaCommand::DeleteUser {
        username: "admin".into(),
    });
    assert_eq!(e.message, "the root admin cannot be deleted");
    log.ok(MetaCommand::SetPassword {
        username: "admin".into(),
        password_hash: "h2".into(),
        updated_at_ms: 10,
    });
    assert_eq!(
        log.state.user("admin").map(|u| u.password_hash.as_str()),
        Some("h2")
    );
    log.ok(MetaCommand::CreateTopic(topic("owned", 1)));
    log.ok(MetaCommand::DeleteUser {
        username: "alice".into(),
    });
    assert_eq!(
        log.t("owned").owner,
        None,
        "deleting a user clears ownership"
    );
    assert_eq!(
        log.err(MetaCommand::DeleteUser {
            username: "alice".into()
        })
        .message,
        "user not found"
    );
}

#[test]
fn state_and_commands_round_trip_through_json() {
    // Proves the snapshot form (serde_json of MetaState) and the log form of commands round-trip
    // exactly, topic ids as 16 hex characters.
    let mut log = Log::new();
    let mut t = topic("rt", 0x681a_429c_0b68_3b2d);
    t.schemas = vec![json!({"type":"object","required":["id"]})];
    log.ok(MetaCommand::CreateTopic(t.clone()));
    log.ok(MetaCommand::CreateUser(user("bob")));
    let text = serde_json::to_string(&log.state).expect("serialise");
    assert!(text.contains("\"681a429c0b683b2d\""), "{text}");
    let back: MetaState = serde_json::from_str(&text).expect("parse");
    assert_eq!(back, log.state);
    let cmd = attach("rt", "x", 5, vec![1, 2, 3]);
    let back: MetaCommand =
        serde_json::from_str(&serde_json::to_string(&cmd).expect("ser")).expect("de");
    assert_eq!(back, cmd);
}

#[test]
fn random_command_sequences_keep_invariants_and_are_deterministic() {
    // Proves, over seeded random command sequences, that fan-out invariants always hold and that
    // two replicas applying the same log reach byte-identical states. Replays from
    // NARAD_TEST_SEED.
    let seed: u64 = std::env::var("NARAD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_2026);
    let mut x = seed;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let names = ["a", "b", "c", "d", "e"];
    let mut a = MetaState::default();
    let mut b = MetaState::default();
    for i in 0..2000u64 {
        let n = names[(next() % 5) as usize].to_string();
        let m = names[(next() % 5) as usize].to_string();
        // Mostly the current incarnation, sometimes a stale one.
        let id = match a.topics.get(&n) {
            Some(t) if next() % 4 != 0 => t.id.0,
            _ => next() % 3 + 1,
        };
        let cmd = match next() % 6 {
            0 | 1 => MetaCommand::CreateTopic(topic(&n, 100 + i)),
            2 => MetaCommand::DeleteTopic {
                name: n,
                id: TopicId(id),
            },
            3 => attach(&n, &m, 0, vec![0; 3]),
            4 => MetaCommand::DetachChild {
                parent: n,
                child: m,
            },
            _ => with_schema(alter(&n, id), json!({"minLength": next() % 3}), None),
        };
        let ra = apply(&mut a, i + 1, cmd.clone());
        let rb = apply(&mut b, i + 1, cmd);
        assert_eq!(ra, rb, "seed {seed}: replicas disagree at {i}");
        if let Err(e) = check_invariants(&a) {
            panic!("seed {seed}: invariant broken at {i}: {e}");
        }
    }
    assert_eq!(
        serde_json::to_string(&a).ok(),
        serde_json::to_string(&b).ok(),
        "seed {seed}"
    );
}
