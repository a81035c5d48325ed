//! A holder that is a separate OS process ([`HolderProcess`]): SIGKILLed while it holds and
//! extends the lock, or SIGSTOPped between its validity check and its write to a fenced
//! resource. Both run on either backend: the signals go to a local process, the nodes may be
//! processes or containers.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use nix::sys::signal::Signal;
use tokio::time::Instant;

use super::super::{contend_lab, every_node, seen_empty, seen_without, shutdown};
use crate::checker::Violation;
use crate::error::LabError;
use crate::history::{At, Event};
use crate::holder::{HolderProcess, Mode};
use crate::lab::Lab;
use crate::raw;
use crate::resource::Resource;
use crate::scenario::{Outcome, KEY};
use crate::workload::{record_acquired, release};

/// Rounds per run: one shows the fault; two show that a round leaves nothing that spoils
/// the next.
const ROUNDS: usize = 2;
/// Extensions the killed holder reports before the kill: it is killed while renewing, right
/// after one (the next is a third of a TTL away, so none is in flight and unreported).
const EXTENSIONS_BEFORE_KILL: usize = 2;
/// The retry policy's longest delay (`RetryPolicy::default`): a contender whose attempt
/// fell just before the key expired tries again at most this much later.
const RETRY_MAX_DELAY: Duration = Duration::from_millis(500);

/// Client 2 is a separate process that locks the key and extends it every third of the TTL;
/// it is SIGKILLed right after its second extension. Clients 0 and 1 contend in-process (the
/// lab's workload: the mix by default) the whole time: they must not win before the killed
/// holder's last validity ends (the checker's overlap rule, its claim counted to that end
/// since it never released), and must win within one TTL plus a retry delay of the kill.
pub(super) fn holder_process_killed(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let clients = lab.clients(2).await?;
        let resource = Arc::new(Resource::default());
        let mut outcome = Outcome::default();
        let mut done = Ok(());
        for round in 0..ROUNDS {
            done = killed_round(lab, &clients, &resource, round, &mut outcome).await;
            if done.is_err() {
                break;
            }
        }
        shutdown(&clients).await;
        // The rounds judged before an error still count.
        match done {
            Ok(()) => Ok(outcome),
            Err(e) => Err(e.with_outcome(outcome)),
        }
    })
}

async fn killed_round(
    lab: &Lab,
    clients: &[redlock_client::Redlock],
    resource: &Arc<Resource>,
    round: usize,
    outcome: &mut Outcome,
) -> Result<(), LabError> {
    let ttl = lab.timing.ttl;
    seen_empty(lab).await?;
    let mut holder = HolderProcess::spawn(lab, 2, Mode::Extend, None).await?;
    let acquired = holder.expect("acquired", ttl * 3).await?;
    let token = holder.record_acquired(lab, &acquired)?;
    // The contenders try from now on: through the hold (two thirds of a TTL), the TTL after
    // the kill and a retry delay, with room to spare.
    let until = Instant::now() + ttl * 4;
    let hold_and_kill = async {
        for _ in 0..EXTENSIONS_BEFORE_KILL {
            let extended = holder.expect("extended", ttl).await?;
            holder.record_extended(lab, &token, &extended)?;
        }
        holder.signal(lab, Signal::SIGKILL)?;
        let killed = lab.history.now();
        // Reports the holder wrote before it died and that were not read yet: an extension
        // left unrecorded would end its recorded claim early, and an overlap with the tail
        // of its real claim would go unseen. Its output ends with the process.
        while let Ok((kind, fields)) = holder.next_report(ttl).await {
            if kind == "extended" {
                holder.record_extended(lab, &token, &fields)?;
            }
        }
        Ok::<At, LabError>(killed)
    };
    let (tally, killed) = tokio::join!(contend_lab(lab, resource, clients, until), hold_and_kill);
    holder.reap(Duration::from_secs(2)).await;
    let killed = killed?;
    let tally = tally?;
    let recovered = lab.history.events().iter().find_map(|e| match e {
        Event::Acquired {
            client, acquired, ..
        } if *acquired >= killed && client != "client-2" => Some(*acquired - killed),
        _ => None,
    });
    match recovered {
        Some(after) if after <= ttl + RETRY_MAX_DELAY => outcome.notes.push(format!(
            "round {round}: {} won, {} gave up; the first lock after the kill {} ms after it \
             (TTL {} ms)",
            tally.acquired,
            tally.failed,
            after.as_millis(),
            ttl.as_millis()
        )),
        Some(after) => outcome.violations.push(Violation::Rule(format!(
            "round {round}: the first lock after the holder's kill came {} ms after it, more \
             than a TTL ({} ms) and a retry delay",
            after.as_millis(),
            ttl.as_millis()
        ))),
        None => outcome.violations.push(Violation::Rule(format!(
            "round {round}: no lock was won after the holder's kill before the contenders stopped"
        ))),
    }
    Ok(())
}

/// Client 1 is a separate process: it takes a fenced lock, reads the value (on node 0,
/// straight, as in `paused_holder_writes_fenced`), checks that its validity leaves room for
/// the write, and is SIGSTOPped right there (it waits on stdin for the go, which the
/// scenario writes while it is stopped, so the stop lands between the check and the write).
/// Once its validity has ended and its keys are gone, client 0 takes the lock and writes;
/// the holder is then resumed and writes with its older token: the resource must reject
/// it, in every round.
pub(super) fn holder_process_paused_writes_fenced(
    lab: &Lab,
) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let addr = lab.nodes().addr(0);
        let url = format!("redis://{addr}");
        let redis = raw::connect(&url, lab.timing.node_timeout * 4).await?;
        let resource = Resource::fenced(redis.clone(), lab.resource_key());
        let other = lab.client(0).await?;
        let mut outcome = Outcome::default();
        let mut rejected = 0;
        let mut done = Ok(());
        // In a soak, as many rounds as fit in the run time (every round stands alone).
        let until = Instant::now() + lab.timing.run_for;
        let mut round = 0;
        while round < ROUNDS || (lab.soak && Instant::now() < until) {
            round += 1;
            match paused_round(lab, &other, &resource, &url).await {
                Ok(true) => rejected += 1,
                Ok(false) => outcome.violations.push(Violation::Rule(format!(
                    "round {round}: the resumed holder's stale write was accepted"
                ))),
                Err(e) => {
                    done = Err(e);
                    break;
                }
            }
        }
        other.shutdown().await;
        raw::close(&redis, lab.timing.node_timeout).await;
        // The rounds judged before an error still count.
        if let Err(e) = done {
            return Err(e.with_outcome(outcome));
        }
        outcome.notes.push(format!(
            "the fenced resource rejected the resumed holder's write in {rejected} of {round} \
             rounds; value {}",
            resource.value()
        ));
        Ok(outcome)
    })
}

/// One round; whether the stopped holder's write was rejected.
async fn paused_round(
    lab: &Lab,
    other: &redlock_client::Redlock,
    resource: &Resource,
    url: &str,
) -> Result<bool, LabError> {
    let ttl = lab.timing.ttl;
    seen_empty(lab).await?;
    let target = Some((url.to_owned(), lab.resource_key()));
    let mut holder = HolderProcess::spawn(lab, 1, Mode::WriteFenced, target).await?;
    let acquired = holder.expect("acquired", ttl * 3).await?;
    let token = holder.record_acquired(lab, &acquired)?;
    holder.expect("checked", ttl).await?;
    holder.signal(lab, Signal::SIGSTOP)?;
    holder.go().await?;
    // Stopped past its validity, until its keys are gone from every node.
    let nodes = every_node(lab);
    seen_without(lab, &token, &nodes, nodes.len(), lab.history.now()).await?;
    let guard = other.lock(KEY).await?;
    let newer = record_acquired(&lab.history, "client-0", &guard);
    resource
        .update(&lab.history, "client-0", &newer, guard.fencing_token())
        .await?;
    release(&lab.history, "client-0", &newer, guard).await;
    holder.signal(lab, Signal::SIGCONT)?;
    let (kind, write) = holder.next_report(ttl).await?;
    if kind != "wrote" && kind != "rejected" {
        return Err(LabError::Schedule(format!(
            "client-1 reported {kind} where its write was expected"
        )));
    }
    holder.record_write(lab, &token, &kind, &write)?;
    let releasing = holder.expect("releasing", ttl).await?;
    holder.record_releasing(lab, &token, &releasing)?;
    holder.reap(ttl * 2).await;
    Ok(kind == "rejected")
}
