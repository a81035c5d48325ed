//! A holder that stalls past its validity, then extends and releases late, after another
//! client has taken the lock.

use futures::future::BoxFuture;
use tokio::time::Instant;

use super::super::{every_node, seen_after, seen_holding, seen_without};
use crate::error::LabError;
use crate::history::Event;
use crate::lab::Lab;
use crate::resource::Resource;
use crate::scenario::{Outcome, KEY};
use crate::workload::{record_acquired, release, WRITE_MARGIN};

pub(super) fn late_release_by_expired_holder(
    lab: &Lab,
) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(late_release(lab, Stale::Library, None))
}

/// How the stale holder extends and releases late.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::scenarios) enum Stale {
    /// Through the library: compare-and-extend, compare-and-delete.
    Library,
    /// The release as a plain `DEL` on every node, as a client without token scripts does.
    NaiveRelease,
    /// The extension as a plain `PEXPIRE` on every node, as a client without token scripts
    /// does.
    NaiveExtend,
}

/// The stale holder's late extension and release, done as `stale` says. Runs `rounds`
/// rounds, or (`None`) as many as fit in the lab's run time.
///
/// The stale extension asks for three TTLs: were it to reach the new holder's key, that
/// key's expiry would move two TTLs later, far past what the checker's slack allows (an
/// extension to one TTL, a few milliseconds after the new holder's own `SET`, moved it by
/// those milliseconds only, and could not be told from it).
///
/// Each step waits for the event it needs, never for a fixed time: client-0 stalls until its
/// validity has ended and the observer has seen its key gone from every node; client-1 wins;
/// the stale extension and release go out only once the observer has seen client-1's token
/// on a quorum of nodes; client-1 goes on only once the observer has sampled those nodes
/// again after the stale release. So a deletion of client-1's key (the naive release) is on
/// record every time, and the checker reports it every time.
pub(in crate::scenarios) async fn late_release(
    lab: &Lab,
    stale_by: Stale,
    rounds: Option<usize>,
) -> Result<Outcome, LabError> {
    let stale = lab.client(0).await?;
    let next = lab.client(1).await?;
    let resource = Resource::default();
    let nodes = every_node(lab);
    let until = Instant::now() + lab.timing.run_for;
    let (mut done, mut skipped) = (0, 0);
    while rounds.map_or(Instant::now() < until, |n| done < n) {
        let first = stale.lock(KEY).await?;
        let first_token = record_acquired(&lab.history, "client-0", &first);
        let fencing = first.fencing_token();
        resource
            .update(&lab.history, "client-0", &first_token, fencing)
            .await?;
        // The stall: client-0 does nothing until its validity has ended and its keys have
        // expired on the nodes.
        tokio::time::sleep_until(first.valid_until()).await;
        seen_without(lab, &first_token, &nodes, nodes.len(), lab.history.now()).await?;
        let second = next.lock(KEY).await?;
        let second_token = record_acquired(&lab.history, "client-1", &second);
        // The observer must have the new holder's token on record before the stale
        // release, or a deletion of it could fall between two samples.
        let holding = seen_holding(lab, &second_token).await?;
        // Late extension and release by the expired holder.
        let started = lab.history.now();
        let long = lab.timing.ttl * 3;
        let extended = if stale_by == Stale::NaiveExtend {
            let ms = i64::try_from(long.as_millis()).unwrap_or(i64::MAX);
            for n in 0..lab.node_count() {
                lab.nodes().redis(n).pexpire(&lab.full_key(KEY), ms).await?;
            }
            // It has no way to tell: it counts on it.
            false
        } else {
            first.extend(Some(long)).await.is_ok()
        };
        lab.history.record(Event::Extend {
            client: "client-0".into(),
            token: first_token.clone(),
            started,
            ended: lab.history.now(),
            valid_until: extended.then(|| lab.history.at(first.valid_until())),
        });
        let released = lab.history.now();
        if stale_by == Stale::NaiveRelease {
            lab.history.record(Event::ReleaseStarted {
                client: "client-0".into(),
                token: first_token.clone(),
                at: released,
            });
            for n in 0..lab.node_count() {
                lab.nodes().redis(n).del(&lab.full_key(KEY)).await?;
            }
            drop(first);
        } else {
            release(&lab.history, "client-0", &first_token, first).await;
        }
        // What the stale release did to the new holder's key is on record before the new
        // holder goes on (and, with the slack, before its own release could explain it).
        seen_after(lab, &holding, lab.history.now()).await?;
        // A well-behaved holder (H4): it writes only with validity left. With a soak's
        // 100 ms TTL the waits above can outlast the validity on a busy machine, and an
        // unconditional write would then be a stale write of the schedule's making. The
        // margin is half the TTL there: a quarter (25 ms) can be outlasted by the write
        // itself (read, then write) on two cores shared by three soaks and the docker set.
        let margin = WRITE_MARGIN.min(lab.timing.ttl / 2);
        if second.remaining().is_some_and(|left| left >= margin) {
            let fencing = second.fencing_token();
            resource
                .update(&lab.history, "client-1", &second_token, fencing)
                .await?;
        } else {
            skipped += 1;
        }
        release(&lab.history, "client-1", &second_token, second).await;
        done += 1;
    }
    stale.shutdown().await;
    next.shutdown().await;
    Ok(Outcome {
        notes: vec![format!(
            "{done} stale extend+release pairs; the new holder skipped {skipped} write(s) for \
             lack of validity"
        )],
        violations: Vec::new(),
    })
}
