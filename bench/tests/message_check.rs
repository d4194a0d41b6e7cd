//! The generator's end-of-run check against an in-memory fake broker: a correct broker passes
//! the smoke run (W1/W2 with a drain, W3), a broker that silently drops messages is caught as
//! "lost" with the exact count, and redeliveries are counted as duplicates, not as loss.
//! Bounded: small counts, short durations and drain timeouts, loopback only.

mod fake;

use fake::{Fake, Faults};
use narad_bench::{run, smoke, BenchArgs, Workload};

fn w3_args(fake: &Fake, topic: &str) -> BenchArgs {
    let mut a = BenchArgs::new(&format!("http://{}", fake.addr));
    a.topic = topic.into();
    a.workload = Workload::W3;
    a.count = Some(3_000);
    a.batch = Some(50);
    a.workers = Some(4);
    a.consumers = 4;
    a.duration = 2.0;
    a.warmup = 0.0;
    a.drain_timeout = 2.0;
    a.request_timeout = 5.0;
    a.size = 64;
    a
}

#[test]
fn smoke_passes_against_a_correct_broker() {
    // Proves smoke() runs W1, W2 (each with a drain) and W3 to completion against a broker that
    // keeps every message, and reports every accepted message acked, none lost, no errors.
    let fake = Fake::start(Faults::default());
    let rep = smoke(fake.addr).expect("smoke runs");
    assert_eq!(rep.runs.len(), 3);
    assert!(rep.problems().is_empty(), "{:?}", rep.problems());
    for r in &rep.runs {
        let c = r.check.as_ref().expect("check");
        assert!(c.accepted > 0, "{}", r.workload);
        assert_eq!(c.acked_unique, c.accepted, "{}", r.workload);
        assert_eq!(
            (c.lost, c.duplicated, c.unexpected),
            (0, 0, 0),
            "{}",
            r.workload
        );
    }
}

#[test]
fn silently_dropped_messages_are_reported_lost() {
    // Proves a broker answering 202 for messages it never stores is caught: lost equals the
    // number the fake dropped, and the run stops by itself after the drain timeout.
    let fake = Fake::start(Faults {
        drop_every: Some(500),
        ..Faults::default()
    });
    let started = std::time::Instant::now();
    let rep = run(&w3_args(&fake, "drops")).expect("run");
    let c = rep.runs[0].check.clone().expect("check");
    assert!(fake.dropped() > 0);
    assert_eq!(c.accepted, 3_000);
    assert_eq!(c.lost, fake.dropped());
    assert_eq!(c.lost_delivered, 0);
    assert_eq!(rep.lost(), fake.dropped());
    assert!(started.elapsed() < std::time::Duration::from_secs(20));
}

#[test]
fn redeliveries_count_as_duplicates_not_loss() {
    // Proves at-least-once redelivery (a second lease on a message) shows up as duplicated,
    // while the message is still acked once and nothing is lost.
    let fake = Fake::start(Faults {
        redeliver_every: Some(100),
        ..Faults::default()
    });
    let rep = run(&w3_args(&fake, "dups")).expect("run");
    let c = rep.runs[0].check.clone().expect("check");
    assert_eq!(c.lost, 0);
    assert_eq!(c.unexpected, 0);
    assert!(c.duplicated >= 29, "duplicated {}", c.duplicated);
    assert_eq!(c.acked_unique, c.accepted);
}

#[test]
fn connections_spread_round_robin_over_several_urls() {
    // Proves a comma list of URLs spreads producer and consumer connections round-robin over
    // the nodes (4 producers + 4 consumers over 3 nodes: 3, 3, 2), that the run waits until a
    // topic created through the first node is seen by the others (which answer 404 for 300 ms
    // here) instead of counting 404s, and that the check still finds every message acked.
    let fake = Fake::start_nodes(
        3,
        Faults {
            visible_after: Some(std::time::Duration::from_millis(300)),
            ..Faults::default()
        },
    );
    let mut a = w3_args(&fake, "spread");
    a.url = Some(fake.urls());
    a.drain_timeout = 10.0;
    let rep = run(&a).expect("run");
    let r = &rep.runs[0];
    let c = r.check.clone().expect("check");
    assert_eq!(r.error_count, 0, "{:?}", r.errors);
    assert_eq!((c.accepted, c.lost, c.unexpected), (3_000, 0, 0));
    assert_eq!(fake.accepted(), vec![3, 3, 2]);
    assert_eq!(r.url, fake.urls());
}
