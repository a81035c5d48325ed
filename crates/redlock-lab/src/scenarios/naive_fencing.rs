//! The fencing demonstrations: plain locks whose fencing tokens come from a lab-side issuer
//! that skips one step of the library's design ([`Naive`]). Each client reaches a fixed
//! quorum of five nodes (its other two links blackholed for the whole run), and the clients
//! acquire in a fixed order, so the counters on the nodes, and the tokens, are the same in
//! every run: one token goes backwards, and is a token handed out before, every time.

use std::time::Duration;

use futures::future::BoxFuture;
use redlock_client::Redlock;
use redlock_core::{Acquisition, Error as CoreError};
use redlock_testkit::LinkFault;
use tokio::time::Instant;

use super::issuer::{Issuer, Naive};
use crate::error::LabError;
use crate::lab::Lab;
use crate::scenario::{Outcome, KEY};
use crate::workload::{record_acquisition, release};

/// INCR and take the max: client `c` reaches the nodes of `INCR_REACH[c]`.
const INCR_REACH: [[usize; 3]; 3] = [[0, 1, 2], [2, 3, 4], [0, 1, 3]];
/// Who acquires, in order. Counters after each: [1,1,1,0,0] .. [3,3,3,0,0] (tokens 1, 2,
/// 3), [3,3,4,1,1], [3,3,5,2,2] (tokens 4, 5), then client 2's quorum {0,1,3} INCRs to
/// [4,4,5,3,2]: token 4, after 5 and again.
const INCR_ORDER: [usize; 6] = [0, 0, 0, 1, 1, 2];

/// Missing counted as 0: client 0 reaches {0,1,2}, client 1 reaches {0,1,3}.
const MISSING_REACH: [[usize; 3]; 2] = [[0, 1, 2], [0, 1, 3]];
/// Who acquires before the restarts: client 1 (token 1, on {0,1,3}), then client 0 three
/// times (tokens 2, 3, 4 on {0,1,2}). Node 3 keeps 1.
const MISSING_BEFORE: [usize; 4] = [1, 0, 0, 0];
/// Restarted empty (a minority): then client 1's quorum is {0,1,3}, which reads nothing,
/// nothing and 1: token 2, after 4 and again.
const MISSING_RESTARTED: [usize; 2] = [0, 1];
/// How long the control may take to win the lock once the nodes are back.
const CONTROL_WITHIN: Duration = Duration::from_secs(5);

pub(super) fn incr_max(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let (clients, issuers) = connect(lab, Naive::IncrMax, INCR_REACH.len()).await?;
        cut(lab, &INCR_REACH);
        let mut tokens = Vec::new();
        for c in INCR_ORDER {
            tokens.push(acquire(lab, &clients[c], &issuers[c], c).await?);
        }
        close(clients, issuers).await;
        Ok(notes(&tokens, Vec::new()))
    })
}

pub(super) fn missing_counter_as_zero(lab: &Lab) -> BoxFuture<'_, Result<Outcome, LabError>> {
    Box::pin(async move {
        let (clients, issuers) = connect(lab, Naive::MissingAsZero, MISSING_REACH.len()).await?;
        // The control: the library's fenced lock, in client 1's place after the restarts.
        let library = lab.client_with(1, |b| b.fencing(true)).await?;
        cut(lab, &MISSING_REACH);
        let mut tokens = Vec::new();
        for c in MISSING_BEFORE {
            tokens.push(acquire(lab, &clients[c], &issuers[c], c).await?);
        }
        let restarts = MISSING_RESTARTED.map(|n| lab.restart(n));
        futures::future::try_join_all(restarts).await?;
        let quorum = MISSING_REACH[1];
        issuers[1].reach(&quorum).await?;
        let control = library_refuses(lab, &library).await?;
        library.shutdown().await;
        tokens.push(acquire(lab, &clients[1], &issuers[1], 1).await?);
        close(clients, issuers).await;
        Ok(notes(&tokens, vec![control]))
    })
}

/// The library in the issuer's place, right after the restarts (before the issuer seeds
/// the emptied nodes with its wrong token): a fenced acquisition must win the lock and get
/// no token, since only one of the three nodes it reaches has a counter. Rounds that lose
/// the lock (the connections to the restarted nodes not back yet) are tried again. A token
/// handed out here would be a fault of the library, and fails the run.
async fn library_refuses(lab: &Lab, library: &Redlock) -> Result<String, LabError> {
    let key = library.full_key(KEY);
    let keys = [key.as_str()];
    let deadline = Instant::now() + CONTROL_WITHIN;
    loop {
        let fenced = Acquisition {
            fenced: true,
            ..Acquisition::new(&keys, lab.timing.ttl)
        };
        match library.coordinator().acquire_with(fenced).await {
            // Every node answers: the counters are reported lost (the operator's repair
            // is `redlock fence --raise-to`); with some silent, "no token, retry".
            Err(CoreError::FencingCountersLost {
                seeded, missing, ..
            }) => {
                return Ok(format!(
                    "control: the library's fenced acquisition, in client-1's place after the \
                     restarts, won the lock and got no token: {seeded} node(s) have a fencing \
                     counter and {missing} lost theirs (FencingCountersLost)"
                ))
            }
            Err(CoreError::NotFenced { reason, .. }) => {
                return Ok(format!(
                    "control: the library's fenced acquisition, in client-1's place after the \
                     restarts, won the lock and got no token: {reason}"
                ))
            }
            Err(error) if Instant::now() >= deadline => {
                return Err(LabError::Schedule(format!(
                    "the library's control acquisition did not win the lock within \
                     {CONTROL_WITHIN:?}: {error}"
                )))
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            Ok(lock) => {
                let fencing = lock.fencing_token();
                let _ = library.coordinator().release(&lock).await;
                return Err(LabError::Setup(format!(
                    "the library handed out fencing token {fencing:?} with two of the three \
                     nodes it reached restarted empty: it must refuse"
                )));
            }
        }
    }
}

/// `n` plain clients and their issuers, connected while every link passes.
async fn connect(
    lab: &Lab,
    naive: Naive,
    n: usize,
) -> Result<(Vec<Redlock>, Vec<Issuer>), LabError> {
    let clients = lab.clients(n).await?;
    let mut issuers = Vec::new();
    for c in 0..n {
        issuers.push(Issuer::connect(lab, c, naive).await?);
    }
    Ok((clients, issuers))
}

/// Blackholes each client's links to the nodes outside its row of `reach`, for the whole
/// run (the lab heals them at the end).
pub(super) fn cut<const Q: usize>(lab: &Lab, reach: &[[usize; Q]]) {
    for (c, reached) in reach.iter().enumerate() {
        for n in (0..lab.node_count()).filter(|n| !reached.contains(n)) {
            lab.link(c, n, LinkFault::Blackhole);
        }
    }
}

/// Client `c` takes the lock (a plain one), gets a token from its issuer, records both as
/// one fenced acquisition and releases.
async fn acquire(lab: &Lab, client: &Redlock, issuer: &Issuer, c: usize) -> Result<u64, LabError> {
    let name = format!("client-{c}");
    let guard = client.lock(KEY).await?;
    let fencing = issuer.issue().await?;
    let token = record_acquisition(&lab.history, &name, &guard, Some(fencing));
    release(&lab.history, &name, &token, guard).await;
    Ok(fencing)
}

async fn close(clients: Vec<Redlock>, issuers: Vec<Issuer>) {
    for issuer in issuers {
        issuer.close().await;
    }
    for client in clients {
        client.shutdown().await;
    }
}

fn notes(tokens: &[u64], mut more: Vec<String>) -> Outcome {
    let list: Vec<String> = tokens.iter().map(u64::to_string).collect();
    more.insert(
        0,
        format!("tokens in the order handed out: {}", list.join(", ")),
    );
    Outcome {
        notes: more,
        violations: Vec::new(),
    }
}
