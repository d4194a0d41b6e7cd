//! A full disk under the metadata Raft store (`narad_raft::store`), on a small tmpfs: a vote is
//! still saved (its file is written in place, never grown), entries received from a leader are
//! refused before openraft sees them when there is no room (so the group does not stop), the
//! store takes votes and entries again once space frees, and all of it reads back after a
//! reopen. Needs root for the mount: skipped (with a message) otherwise; as root a failed mount
//! fails the test.

#[path = "../../io/tests/tmpfs/mod.rs"]
mod tmpfs;

use narad_raft::network::reserve_for_append;
use narad_raft::store::{LogStore, VOTE_SLOT_BYTES};
use narad_raft::types::{Entry, LogId, Vote};
use openraft::impls::leader_id_adv::LeaderId;
use openraft::storage::{IOFlushed, RaftLogStorage};
use openraft::{EntryPayload, RaftLogReader};

fn entry(term: u64, index: u64) -> Entry {
    Entry {
        log_id: LogId::new(
            LeaderId {
                term,
                node_id: "n1".to_string(),
            },
            index,
        ),
        payload: EntryPayload::Blank,
    }
}

#[test]
fn votes_are_saved_and_appends_refused_without_stopping_on_a_full_disk() {
    // Before, the vote was a new file replaced atomically: on the full disk `save_vote` failed
    // with ENOSPC ("when Write Vote: ... No space left on device"), openraft stopped the group
    // and the node stayed unready after space freed.
    let mnt = std::env::temp_dir().join(format!("narad-raft-vote-full-{}", std::process::id()));
    let Some(mount) = tmpfs::Mount::tmpfs(&mnt, 4 << 20) else {
        return;
    };
    let dir = mount.0.join("metastore");
    narad_io::rt::block_on(async {
        let (mut log, _) = LogStore::open(&dir).expect("open");
        log.save_vote(&Vote::new(1, "n1".to_string()))
            .await
            .expect("vote");
        log.append(vec![entry(1, 1), entry(1, 2)], IOFlushed::noop())
            .await
            .expect("append");
        let filler = tmpfs::fill_to_the_last_byte(&mount.0);

        // Votes on the full disk: both slots, twice over.
        for term in 2..=5 {
            log.save_vote(&Vote::new(term, "n2".to_string()))
                .await
                .unwrap_or_else(|e| panic!("vote of term {term} on the full disk: {e}"));
        }
        // The leader's entries: more than the room reserved ahead is refused before openraft
        // sees them, with nothing written; what fits the reservation is appended.
        let e = reserve_for_append(&log, 4 << 20).expect_err("no room for 4 MiB of entries");
        assert!(e.contains("No space left"), "{e}");
        reserve_for_append(&log, 1024).expect("a small append fits the reservation");
        log.append(vec![entry(5, 3)], IOFlushed::noop())
            .await
            .expect("append within the reservation on the full disk");
        log.save_committed(Some(entry(5, 3).log_id))
            .await
            .expect("committed id on the full disk");

        // Space frees: everything goes on, without a reopen.
        std::fs::remove_file(&filler).unwrap();
        reserve_for_append(&log, 2 << 20).expect("room once space freed");
        log.append(vec![entry(5, 4)], IOFlushed::noop())
            .await
            .expect("append after space freed");
        log.save_vote(&Vote::new(6, "n3".to_string()))
            .await
            .expect("vote after space freed");
    });

    // Everything acknowledged reads back.
    narad_io::rt::block_on(async {
        let (mut log, _) = LogStore::open(&dir).expect("reopen");
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new(6, "n3".to_string()))
        );
        assert_eq!(log.entry_indexes(), vec![1, 2, 3, 4]);
        let got = log.try_get_log_entries(1..5).await.unwrap();
        assert_eq!(got.len(), 4);
    });

    // A vote write torn by a crash (the newer slot damaged) falls back to the previous vote,
    // the one openraft acted on before.
    let path = dir.join("raft-vote");
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(bytes.len(), 2 * VOTE_SLOT_BYTES);
    // Term 6 was the 6th vote: sequence 6, the even slot.
    bytes[24] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    narad_io::rt::block_on(async {
        let (mut log, _) = LogStore::open(&dir).expect("reopen after a torn vote");
        assert_eq!(
            log.read_vote().await.unwrap(),
            Some(Vote::new(5, "n2".to_string()))
        );
    });
    drop(mount);
}
