//! Demonstrations: each breaks one assumption of Redlock or one step of the fencing design,
//! and the checker must report the violation that follows. They prove the checker can fail,
//! and show users what the assumptions are for.

use std::time::Duration;

use futures::future::BoxFuture;

use super::fair_head::{self, FAIR_HEAD_CLIENTS};
use super::naive_fencing;
use super::per_node_semaphore::per_node_limit_semaphore;
use super::reader_ignores_writer::reader_ignores_writer;
use super::steal::{hold_then_steal, Break, ROUNDS};
use crate::backend::Setup;
use crate::error::LabError;
use crate::lab::{Fencing, Lab, Timing};
use crate::resource::Resource;
use crate::scenario::{Expect, Outcome, Scenario};

pub(super) const THREE: Setup = Setup {
    nodes: 3,
    persistent: false,
    fake_clock: false,
    clusters: &[],
};

/// What a mutual-exclusion break shows: two holders at once, and the update of one lost.
pub(super) const OVERLAP: &[&str] = &["overlap", "lost update"];
/// What a broken token issuer shows: a token lower than one handed out before its
/// acquisition began, and equal to one handed out before.
const TOKEN_BACKWARDS: &[&str] = &["fencing token backwards", "fencing token reused"];
const FIVE: Setup = Setup { nodes: 5, ..THREE };

pub(super) fn demo(
    name: &'static str,
    breaks: &'static str,
    caught_as: &'static [&'static str],
    shows: &'static str,
    run: crate::scenario::Driver,
) -> Scenario {
    Scenario {
        name,
        shows,
        expect: Expect::Violation { breaks, caught_as },
        setup: THREE,
        clients: 2,
        fencing: Fencing::Off,
        timing: Timing::default(),
        soak: None,
        semaphore: None,
        rwlock: false,
        run,
    }
}

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            timing: Timing {
                // A container restart takes about a second: the holder's validity must
                // outlast it for the second holder to overlap. Nothing waits this TTL out.
                ttl: Duration::from_secs(3),
                ..Timing::default()
            },
            ..demo(
                "restart_without_persistence",
                "H2: no key vanishes before its TTL (a restarted node must keep its keys or stay down longer than the TTL)",
                OVERLAP,
                "a node of the holder's two-node quorum restarts at once without persistence; another client then wins that node and the third one while the first still holds",
                restart_without_persistence,
            )
        },
        Scenario {
            setup: Setup {
                fake_clock: true,
                ..THREE
            },
            timing: Timing {
                // Each round waits until the fast nodes have expired the holder's keys,
                // after half this TTL.
                ttl: Duration::from_millis(500),
                ..Timing::default()
            },
            ..demo(
                "clock_2x",
                "H3: server clock rates within the drift budget",
                OVERLAP,
                "two of three nodes' clocks run at 2x: the holder's keys expire there after half the TTL and another client wins while the first still holds",
                clock_2x,
            )
        },
        demo(
            "key_evicted",
            "H2: no key vanishes before its TTL (maxmemory-policy noeviction)",
            OVERLAP,
            "the holder's key is evicted (real memory pressure) on a node of its two-node quorum; another client wins that node and the third one while the first still holds",
            key_evicted,
        ),
        Scenario {
            timing: Timing {
                // Each round waits this TTL out (the stale holder's stall).
                ttl: Duration::from_millis(300),
                ..Timing::default()
            },
            ..demo(
                "naive_release_by_expired_holder",
                "G3: only the owner deletes its key (the compare-and-delete release script)",
                &["token removed early"],
                "late_release_by_expired_holder with the stale holder's release done as a plain DEL, as a client without token scripts would: the new holder's key is deleted under it",
                naive_release_by_expired_holder,
            )
        },
        Scenario {
            timing: Timing {
                // Each round waits this TTL out (the stale holder's stall).
                ttl: Duration::from_millis(300),
                ..Timing::default()
            },
            ..demo(
                "naive_extend_by_expired_holder",
                "G3: only the owner extends its key (the compare-and-extend script)",
                &["foreign extend"],
                "late_release_by_expired_holder with the stale holder's extension done as a plain PEXPIRE, as a client without token scripts would: the new holder's key lives on past its holder's claim",
                naive_extend_by_expired_holder,
            )
        },
        Scenario {
            timing: Timing {
                // Each round waits this TTL out (the holder's stall).
                ttl: Duration::from_millis(300),
                ..Timing::default()
            },
            ..demo(
                "paused_holder_writes",
                "H4: the holder stops using the lock before its validity ends",
                &["stale write", "lost update"],
                "the holder stalls (as in a GC or SIGSTOP pause) between its read and its write, past its validity; another client takes the lock and writes; the stale write loses that update",
                paused_holder_writes,
            )
        },
        Scenario {
            setup: FIVE,
            clients: 3,
            ..demo(
                "fencing_by_incr_max",
                "quorum write-back: a token is the highest counter of a quorum plus one, handed out only after a quorum recorded it, so every later quorum sees it (INCR on each node and the max skips both)",
                TOKEN_BACKWARDS,
                "a lab-side issuer INCRs the counter on the three of five nodes its client reaches and takes the max; clients reaching {0,1,2} three times, {2,3,4} twice, then {0,1,3}: the last token is 4, after 5",
                naive_fencing::incr_max,
            )
        },
        Scenario {
            setup: FIVE,
            clients: FAIR_HEAD_CLIENTS,
            ..demo(
                "naive_fair_head_never_steps_back",
                "fair queue: a live head that cannot win steps back (a head that keeps refreshing its place holds every waiter behind it up for its whole wait)",
                &["scenario rule"],
                "fair_head_answers_late with a head built on the core's fair acquisition that never steps back: while its answers come late, the two clients behind it win the key far less often than before and after",
                fair_head::naive_fair_head_never_steps_back,
            )
        },
        Scenario {
            clients: 3,
            ..demo(
                "per_node_limit_semaphore",
                "semaphore: a holder counts only once a quorum holds one permit for it (a per-node limit won on a majority lets each contender win a different majority)",
                &["too many holders"],
                "a per-node-limit semaphore (each node admits at most two holders, a holder counts once a majority admitted it), three nodes, two permits: three clients, each reaching a different two-node majority, are all admitted; the library's semaphore in the same places admits two",
                per_node_limit_semaphore,
            )
        },
        demo(
            "reader_ignores_writer_rwlock",
            "read-write lock: a reader comes in only where no writer holds the lock (a reader that checks a waiting writer's intent but not the writer's key is admitted by every node while a writer holds)",
            &["writer not alone"],
            "a read-write lock whose reader checks only the intent, three nodes: client-0 takes the write side on every node, then client-1's reader is admitted by every node too; the library's read-write lock in the same places refuses the reader",
            reader_ignores_writer,
        ),
        Scenario {
            setup: FIVE,
            ..demo(
                "fencing_counts_missing_counter_as_zero",
                "missing counter not counted: a node without its counter (restarted empty) is not counted as 0, and a token needs the counters of a quorum",
                TOKEN_BACKWARDS,
                "a lab-side read-max-write-back issuer that counts a missing counter as 0: tokens 1 on {0,1,3}, then 2-4 on {0,1,2}; nodes 0 and 1 restart empty; {0,1,3} then reads nothing, nothing, 1 and hands out 2 (the library, in the same place, refuses)",
                naive_fencing::missing_counter_as_zero,
            )
        },
    ]
}

/// [`hold_then_steal`] with the in-memory resource.
async fn steal(lab: &Lab, fault: Break) -> Result<Outcome, LabError> {
    hold_then_steal(lab, fault, &Resource::default()).await
}

fn restart_without_persistence(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(steal(lab, Break::RestartNode1))
}

fn clock_2x(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        lab.clock_rate(0, 2.0)?;
        lab.clock_rate(1, 2.0)?;
        steal(lab, Break::FastClocks).await
    })
}

fn key_evicted(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(steal(lab, Break::EvictNode1))
}

fn paused_holder_writes(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(steal(lab, Break::StallHolder))
}

fn naive_release_by_expired_holder(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(super::safe::late_release(
        lab,
        super::safe::Stale::NaiveRelease,
        Some(ROUNDS),
    ))
}

fn naive_extend_by_expired_holder(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(super::safe::late_release(
        lab,
        super::safe::Stale::NaiveExtend,
        Some(ROUNDS),
    ))
}
