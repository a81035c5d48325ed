//! Concurrent contenders for one key, each with its own connections.

mod common;

use std::time::Duration;

use common::coordinator;
use futures::future::join_all;
use redlock_core::Coordinator;
use redlock_testkit::NodeSet;

const CONTENDERS: usize = 6;
const ROUNDS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_one_contender_wins_each_round_and_losers_leave_nothing() {
    let set = NodeSet::start(5).await.unwrap();
    let contenders: Vec<Coordinator> =
        join_all((0..CONTENDERS).map(|_| coordinator(&set, Duration::from_secs(1)))).await;

    let mut rounds_with_a_winner = 0;
    for round in 0..ROUNDS {
        let key = format!("contended-{round}");
        let results = join_all(
            contenders
                .iter()
                .map(|c| c.acquire(&key, Duration::from_secs(30))),
        )
        .await;
        let winners: Vec<_> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        assert!(
            winners.len() <= 1,
            "round {round}: {} winners",
            winners.len()
        );
        for c in &contenders {
            c.quiesce().await;
        }
        let holders = set.nodes_holding(&key).await;
        match winners.first() {
            Some(lock) => {
                rounds_with_a_winner += 1;
                // Every key left on a node is the winner's: all losers rolled back.
                for i in holders {
                    assert_eq!(
                        set.node(i).get(&key).await.unwrap().as_deref(),
                        Some(lock.token().as_str())
                    );
                }
            }
            // A split vote: nobody reached the quorum, and everybody rolled back.
            None => assert!(
                holders.is_empty(),
                "round {round}: split vote left keys on {holders:?}"
            ),
        }
    }
    // Split votes are legitimate, but a round engine where nobody ever wins is broken.
    assert!(rounds_with_a_winner > 0, "no round had a winner");
}
