//! Hold then steal: client 0 holds the lock and reads the value, a fault lets client 1 take
//! the lock and update the value, then client 0 writes what it read. The demonstrations of
//! broken assumptions run it, and so does the must-pass scenario where the resource is
//! fenced.

use redlock_client::{LockGuard, Redlock};
use redlock_testkit::{Failover, LinkFault};
use tokio::time::Instant;

use super::{every_node, seen_empty, seen_without};
use crate::error::LabError;
use crate::lab::Lab;
use crate::resource::{Read, Resource};
use crate::scenario::{Outcome, KEY};
use crate::workload::{record_acquired, release, WRITE_MARGIN};

/// How many hold-then-steal rounds a scenario runs. Each round provokes its fault on its
/// own (every step waits for the event it needs), so one would do; two show that a round
/// leaves nothing behind that spoils the next.
pub(super) const ROUNDS: usize = 2;

/// What happens between the first holder's win and the second client's attempt.
#[derive(Clone, Copy)]
pub(super) enum Break {
    /// Client 0 cannot reach node 2 (so its quorum is {0, 1}); node 1 restarts empty.
    RestartNode1,
    /// Client 0 cannot reach node 2; node 1's keys are evicted.
    EvictNode1,
    /// Nodes 0 and 1 run at 2x (set beforehand): wait until they have expired the keys.
    FastClocks,
    /// The holder stalls past its validity before writing.
    StallHolder,
    /// Nodes 0 and 1 (fake clocks) step forward by two TTLs: wait until their keys are gone.
    JumpClocks,
    /// Client 0 cannot reach node 2; node 1 crashes within the second after the lock's
    /// write, losing its AOF's unsynced tail (`appendfsync everysec`), and restarts.
    CrashLosingAofTail,
    /// Nodes 0 and 1 are clusters of one master and a replica, whose replication is held
    /// back before client 0 takes the lock; both replicas then take over (`TAKEOVER`),
    /// without the key. One round: each fails both clusters over.
    ClusterFailovers,
}

/// Client 0 takes the lock and reads the value; the fault happens; client 1 takes the lock,
/// updates the value and releases; client 0 then writes what it read and releases. With the
/// assumption intact client 1 could not win before client 0 let go.
///
/// Every step waits for an event, never for a fixed time: the fault calls return once the
/// node is back or the keys are evicted; with fast clocks client 1 goes once the observer has
/// seen client 0's token gone from the fast nodes; a stalled holder waits until its validity
/// has ended and its keys are gone. So client 1 wins in every round, and (except for the
/// stall, whose point is to outlive the validity) while client 0's validity still runs. Client
/// 0 then behaves well, writing only with validity left, for H2 and H3: the violation comes
/// from the broken assumption alone.
///
/// The writes go to `resource`; with a [fenced](Resource::fenced) one (and fenced clients)
/// each write carries the writer's fencing token, and the notes count the rejected ones.
pub(super) async fn hold_then_steal(
    lab: &Lab,
    fault: Break,
    resource: &Resource,
) -> Result<Outcome, LabError> {
    let first = lab.client(0).await?;
    let second = lab.client(1).await?;
    if matches!(
        fault,
        Break::RestartNode1 | Break::EvictNode1 | Break::CrashLosingAofTail
    ) {
        // For every round, healed only after the last (by the lab, once the clients are shut
        // down). A blackhole on the open connection, not refused connections: a command that
        // the client queues while it reconnects is sent once the link lets it through, so a
        // link refused or healed between rounds lets client-0's SET land on node 2 late,
        // after the round, as a key left behind that has nothing to do with the break.
        lab.link(0, 2, LinkFault::Blackhole);
    }
    let mut rounds = Rounds {
        lab,
        fault,
        resource,
        notes: Vec::new(),
        stolen: 0,
        stolen_while_valid: 0,
    };
    // In a soak, as many rounds as fit in the run time (every round stands alone).
    let until = Instant::now() + lab.timing.run_for;
    let (rounds_asked, more) = match fault {
        Break::ClusterFailovers => (1, false),
        _ => (ROUNDS, lab.soak),
    };
    let mut round = 0;
    while round < rounds_asked || (more && Instant::now() < until) {
        round += 1;
        rounds.round(round, &first, &second).await?;
    }
    let Rounds {
        mut notes,
        stolen,
        stolen_while_valid,
        ..
    } = rounds;
    notes.push(format!(
        "client-1 won in {stolen} of {round} rounds, {stolen_while_valid} of them while \
         client-0's validity still ran"
    ));
    first.shutdown().await;
    second.shutdown().await;
    Ok(Outcome {
        notes,
        violations: Vec::new(),
    })
}

/// The rounds of one hold-then-steal run, and what they have noted and counted so far.
struct Rounds<'a> {
    lab: &'a Lab,
    fault: Break,
    resource: &'a Resource,
    notes: Vec<String>,
    /// Rounds in which client 1 won.
    stolen: usize,
    /// Rounds in which client 1 won while client 0's validity still ran.
    stolen_while_valid: usize,
}

impl Rounds<'_> {
    /// One round: client 0 holds and reads, the fault, client 1 steals, client 0 writes.
    async fn round(
        &mut self,
        round: usize,
        first: &Redlock,
        second: &Redlock,
    ) -> Result<(), LabError> {
        let lab = self.lab;
        // Each round starts with the key absent on every node.
        seen_empty(lab).await?;
        if matches!(self.fault, Break::ClusterFailovers) {
            for n in [0, 1] {
                lab.hold_back_replication(n, 0).await?;
            }
        }
        let held = first.lock(KEY).await?;
        let token = record_acquired(&lab.history, "client-0", &held);
        let read = self.resource.read(&lab.history).await?;
        self.break_assumption(&held, &token).await?;
        let second_wrote = self.steal(round, second, &held).await?;
        self.finish_first(round, &held, &token, read, second_wrote)
            .await?;
        release(&lab.history, "client-0", &token, held).await;
        Ok(())
    }

    /// The fault, while client 0 holds the lock with `token`: returns once it has done
    /// what lets client 1 win.
    async fn break_assumption(&self, held: &LockGuard, token: &str) -> Result<(), LabError> {
        let lab = self.lab;
        match self.fault {
            Break::RestartNode1 => lab.restart(1).await?,
            Break::CrashLosingAofTail => {
                super::lost_keys::crash_losing_aof_tail(lab, 1, token).await?
            }
            Break::JumpClocks => {
                let by_ms = i64::try_from(lab.timing.ttl.as_millis() * 2).unwrap_or(i64::MAX);
                lab.clock_jump(0, by_ms).await?;
                lab.clock_jump(1, by_ms).await?;
                seen_without(lab, token, &[0, 1], 2, lab.history.now()).await?;
            }
            Break::EvictNode1 => {
                lab.evict(1).await?;
            }
            Break::ClusterFailovers => {
                for n in [0, 1] {
                    lab.fail_over(n, 0, Failover::Takeover).await?;
                }
                for n in [0, 1] {
                    lab.resume_replication(n, 0).await?;
                }
            }
            Break::FastClocks => {
                // Samples sent once the round's SETs have all landed or timed out.
                let since = lab.history.now() + lab.timing.node_timeout;
                seen_without(lab, token, &[0, 1], 2, since).await?;
            }
            Break::StallHolder => {
                tokio::time::sleep_until(held.valid_until()).await;
                let nodes = every_node(lab);
                seen_without(lab, token, &nodes, nodes.len(), lab.history.now()).await?;
            }
        }
        Ok(())
    }

    /// Client 1 tries the lock while client 0 still `held` it, updates the value if it won
    /// with validity left, and releases. Returns whether it wrote.
    async fn steal(
        &mut self,
        round: usize,
        second: &Redlock,
        held: &LockGuard,
    ) -> Result<bool, LabError> {
        let lab = self.lab;
        let guard = match second.lock(KEY).await {
            Ok(guard) => guard,
            Err(error) => {
                self.notes
                    .push(format!("round {round}: client-1 did not win: {error}"));
                return Ok(false);
            }
        };
        self.stolen += 1;
        if Instant::now() < held.valid_until() {
            self.stolen_while_valid += 1;
        }
        let stolen_token = record_acquired(&lab.history, "client-1", &guard);
        // A well-behaved new holder too (H4): with a soak's 100 ms TTL on loaded
        // cores, an unconditional write once landed a few ms after its validity.
        let margin = WRITE_MARGIN.min(lab.timing.ttl / 2);
        let mut wrote = false;
        if guard.remaining().is_some_and(|left| left >= margin) {
            let fencing = guard.fencing_token();
            self.resource
                .update(&lab.history, "client-1", &stolen_token, fencing)
                .await?;
            wrote = true;
        } else {
            self.notes.push(format!(
                "round {round}: client-1 skipped its write, too little validity left"
            ));
        }
        release(&lab.history, "client-1", &stolen_token, guard).await;
        Ok(wrote)
    }

    /// Client 0 finishes its critical section as if nothing happened: a well-behaved
    /// holder (writing what it `read`, only with validity left), except where writing late
    /// is the break. The stalled holder's late write is the round's point only after client
    /// 1 wrote: otherwise a fenced resource has no newer token to reject it by, and the
    /// round is void (with a soak's short TTL client 1 can win with too little validity to
    /// write).
    async fn finish_first(
        &mut self,
        round: usize,
        held: &LockGuard,
        token: &str,
        read: Read,
        second_wrote: bool,
    ) -> Result<(), LabError> {
        let stalled = matches!(self.fault, Break::StallHolder);
        if stalled && !second_wrote {
            self.notes.push(format!(
                "round {round}: client-0 skipped its late write, client-1 wrote nothing"
            ));
        } else if stalled || held.remaining().is_some_and(|left| left >= WRITE_MARGIN) {
            let fencing = held.fencing_token();
            let written = self
                .resource
                .write(&self.lab.history, "client-0", token, fencing, read)
                .await?;
            if let (false, Some(fencing)) = (written, fencing) {
                self.notes.push(format!(
                    "round {round}: the resource rejected client-0's write with fencing token \
                     {fencing}"
                ));
            }
        } else {
            self.notes.push(format!(
                "round {round}: client-0 skipped its write, too little validity left"
            ));
        }
        Ok(())
    }
}
