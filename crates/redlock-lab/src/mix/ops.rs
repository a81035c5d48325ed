//! The operations of the mix, each recorded with its outcome.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use redlock_client::{Error, LockGuard, LockOptions, Owner, Redlock};
use tokio::time::Instant;

use super::reader::Reader;
use super::{Mix, Op, MANY_EXTRA};
use crate::error::LabError;
use crate::history::{Event, History};
use crate::lab::Lab;
use crate::resource::Resource;
use crate::scenario::KEY;
use crate::workload::{record_acquired, release_round, rounds_run, Tally, WRITE_MARGIN};

/// What every operation of one client works with.
struct Ctx<'a> {
    history: &'a History,
    resource: &'a Resource,
    reader: &'a Reader,
    client: &'a Redlock,
    name: String,
    ttl: Duration,
    node_timeout: Duration,
}

/// Every client runs the mix until `until`, each with its own generator; returns the
/// summed tally. Fails only when an operation's configuration is refused (a lab bug, not a
/// result).
pub(crate) async fn contend_mixed(
    lab: &Lab,
    resource: &Arc<Resource>,
    clients: &[Redlock],
    until: Instant,
    mix: &Mix,
) -> Result<Tally, LabError> {
    let tallies = contend_mixed_each(lab, resource, clients, until, mix).await?;
    Ok(tallies.iter().sum())
}

/// [`contend_mixed`], returning each client's own tally, in the order of `clients`.
pub(crate) async fn contend_mixed_each(
    lab: &Lab,
    resource: &Arc<Resource>,
    clients: &[Redlock],
    until: Instant,
    mix: &Mix,
) -> Result<Vec<Tally>, LabError> {
    let reader = Reader::connect(lab).await;
    let workers = clients.iter().enumerate().map(|(c, client)| {
        let ctx = Ctx {
            history: &lab.history,
            resource,
            reader: &reader,
            client,
            name: format!("client-{c}"),
            ttl: lab.timing.ttl,
            node_timeout: lab.timing.node_timeout,
        };
        let mut rng = mix.rng(c);
        async move {
            let mut tally = Tally::default();
            while Instant::now() < until {
                let op = mix.pick(&mut rng);
                let owner = matches!(op, Op::Reentrant | Op::ReentrantConcurrent).then(Owner::new);
                let started = ctx.history.now();
                let outcome = ctx.run(op, owner.as_ref(), &mut rng, &mut tally).await?;
                ctx.history.record(Event::Op {
                    client: ctx.name.clone(),
                    op: op.name(),
                    owner: owner.map(|o| o.as_str().to_owned()),
                    started,
                    ended: ctx.history.now(),
                    outcome,
                });
            }
            Ok::<_, LabError>(tally)
        }
    });
    let tallies = futures::future::join_all(workers).await;
    reader.close().await;
    tallies.into_iter().collect()
}

impl Ctx<'_> {
    async fn run(
        &self,
        op: Op,
        owner: Option<&Owner>,
        rng: &mut StdRng,
        tally: &mut Tally,
    ) -> Result<String, LabError> {
        Ok(match op {
            Op::Plain => match self.won(self.client.lock(KEY).await, tally)? {
                Some(guard) => self.cycle(guard, tally).await,
                None => "not acquired".into(),
            },
            Op::ExtendLonger => self.extended(self.ttl * 2, tally).await?,
            Op::ExtendShorter => self.extended(self.ttl / 2, tally).await?,
            Op::Renewed => self.renewed(tally).await?,
            Op::Fair => self.fair(tally).await?,
            Op::Many => self.many(rng, tally).await?,
            Op::Dropped => self.dropped(tally).await?,
            Op::Cancelled => self.cancelled(rng, tally).await?,
            Op::Grouped => self.grouped(tally).await?,
            Op::Reentrant | Op::ReentrantConcurrent => {
                let owner = owner.expect("a reentrant operation has an owner");
                self.reentrant(owner, op == Op::ReentrantConcurrent, rng, tally)
                    .await?
            }
        })
    }

    /// A lock extended to `ttl` (the extension recorded, the nodes read after it), then
    /// written and released.
    async fn extended(&self, ttl: Duration, tally: &mut Tally) -> Result<String, LabError> {
        let Some(guard) = self.won(self.client.lock(KEY).await, tally)? else {
            return Ok("not acquired".into());
        };
        let token = guard.lock().token().as_str().to_owned();
        let started = self.history.now();
        let extended = guard.extend(Some(ttl)).await;
        self.history.record(Event::Extend {
            client: self.name.clone(),
            token,
            started,
            ended: self.history.now(),
            valid_until: extended
                .is_ok()
                .then(|| self.history.at(guard.valid_until())),
        });
        self.reader.check(&self.name, &guard).await;
        let cycle = self.cycle(guard, tally).await;
        Ok(match extended {
            Ok(()) => cycle,
            Err(e) => format!("extend failed ({}), {cycle}", kind(&e)),
        })
    }

    /// A fair (queued) lock, not fenced.
    async fn fair(&self, tally: &mut Tally) -> Result<String, LabError> {
        let fair = LockOptions {
            fair: Some(true),
            fenced: Some(false),
            ..LockOptions::default()
        };
        Ok(
            match self.won(self.client.lock_with(KEY, &fair).await, tally)? {
                Some(guard) => self.cycle(guard, tally).await,
                None => "not acquired".into(),
            },
        )
    }

    /// A multi-key lock: the key and one of [`MANY_EXTRA`].
    async fn many(&self, rng: &mut StdRng, tally: &mut Tally) -> Result<String, LabError> {
        let plain = LockOptions::default();
        let extra = MANY_EXTRA[rng.gen_range(0..MANY_EXTRA.len())];
        Ok(
            match self.won(self.client.lock_many(&[KEY, extra], &plain).await, tally)? {
                Some(guard) => self.cycle(guard, tally).await,
                None => "not acquired".into(),
            },
        )
    }

    /// A lock written once and then dropped instead of released.
    async fn dropped(&self, tally: &mut Tally) -> Result<String, LabError> {
        let Some(guard) = self.won(self.client.lock(KEY).await, tally)? else {
            return Ok("not acquired".into());
        };
        let token = guard.lock().token().as_str().to_owned();
        self.write(&guard, &token, tally).await;
        // The holder stops using the lock here; the key goes in the background.
        self.history.record(Event::ReleaseStarted {
            client: self.name.clone(),
            token,
            at: self.history.now(),
        });
        drop(guard);
        Ok("dropped".into())
    }

    /// An acquisition given 1-30 ms: cancelled when it takes longer.
    async fn cancelled(&self, rng: &mut StdRng, tally: &mut Tally) -> Result<String, LabError> {
        let after = Duration::from_millis(rng.gen_range(1..=30));
        Ok(
            match tokio::time::timeout(after, self.client.lock(KEY)).await {
                Err(_) => {
                    tally.failed += 1;
                    "cancelled".into()
                }
                Ok(result) => match self.won(result, tally)? {
                    Some(guard) => format!("won in time, {}", self.cycle(guard, tally).await),
                    None => "not acquired".into(),
                },
            },
        )
    }

    /// Three acquisitions of the key at once by one client, each written and released.
    async fn grouped(&self, tally: &mut Tally) -> Result<String, LabError> {
        let take = || async {
            let mut own = Tally::default();
            let outcome = match self.won(self.client.lock(KEY).await, &mut own)? {
                Some(guard) => self.cycle(guard, &mut own).await,
                None => "not acquired".into(),
            };
            Ok::<_, LabError>((own, outcome))
        };
        let (a, b, c) = tokio::join!(take(), take(), take());
        let mut outcomes = Vec::new();
        let mut merged = vec![std::mem::take(tally)];
        for result in [a, b, c] {
            let (own, outcome) = result?;
            merged.push(own);
            outcomes.push(outcome);
        }
        *tally = merged.iter().sum();
        Ok(outcomes.join("; "))
    }

    /// The guard of a won acquisition (recorded, counted), `None` for one that gave up.
    fn won(
        &self,
        result: Result<LockGuard, Error>,
        tally: &mut Tally,
    ) -> Result<Option<LockGuard>, LabError> {
        match result {
            Ok(guard) => {
                tally.acquired += 1;
                tally.rounds += u64::from(guard.attempts());
                tally.record_round(guard.lock().report());
                record_acquired(self.history, &self.name, &guard);
                Ok(Some(guard))
            }
            Err(Error::InvalidConfig(e)) => Err(LabError::Setup(format!(
                "{}: the mix asked for a lock the configuration refuses: {e}",
                self.name
            ))),
            Err(Error::InvalidArgument(e)) => Err(LabError::Setup(format!(
                "{}: the mix asked for a lock with an argument the library refuses: {e}",
                self.name
            ))),
            Err(error) => {
                tally.failed += 1;
                tally.rounds += u64::from(rounds_run(&error));
                if let Some(report) = error.report() {
                    tally.record_round(report);
                }
                Ok(None)
            }
        }
    }

    /// One update of the resource, if enough validity is left.
    async fn write(&self, guard: &LockGuard, token: &str, tally: &mut Tally) {
        if guard.remaining().is_some_and(|left| left >= WRITE_MARGIN) {
            let update =
                self.resource
                    .update(self.history, &self.name, token, guard.fencing_token());
            if let Err(error) = update.await {
                tracing::warn!(client = %self.name, %error, "update failed");
            }
        } else {
            tally.skipped_writes += 1;
        }
    }

    /// Write, release: the end of most operations.
    async fn cycle(&self, guard: LockGuard, tally: &mut Tally) -> String {
        let token = guard.lock().token().as_str().to_owned();
        self.write(&guard, &token, tally).await;
        self.release(guard, &token, tally).await
    }

    async fn release(&self, guard: LockGuard, token: &str, tally: &mut Tally) -> String {
        let started = Instant::now();
        match release_round(self.history, &self.name, token, guard).await {
            Some(report) => {
                tally.release_rounds.push(started.elapsed());
                tally.record_round(&report);
                "ok".into()
            }
            None => "ok, release failed".into(),
        }
    }

    /// A lock with renewal on, held for 1.5 of its TTL while writing. The TTL is a quarter
    /// of the scenario's (at least four node timeouts, so that a renewal can finish in
    /// time): held longer than it, the hold depends on renewal, without blocking the other
    /// clients for long.
    async fn renewed(&self, tally: &mut Tally) -> Result<String, LabError> {
        let ttl = (self.ttl / 4).max(self.node_timeout * 4);
        let options = LockOptions {
            renew: Some(true),
            ttl: Some(ttl),
            ..LockOptions::default()
        };
        let Some(guard) = self.won(self.client.lock_with(KEY, &options).await, tally)? else {
            return Ok("not acquired".into());
        };
        let token = guard.lock().token().as_str().to_owned();
        let hold_until = Instant::now() + ttl.mul_f64(1.5);
        let (mut seen, mut renewals) = (guard.valid_until(), 0);
        let mut polled = self.history.now();
        while Instant::now() < hold_until && guard.is_valid() {
            self.write(&guard, &token, tally).await;
            tokio::time::sleep(ttl / 8).await;
            let now = self.history.now();
            // The renewer may have run a round since the last poll, and every round
            // lengthens the key on the nodes that still hold it, a round that failed (too few
            // nodes, retried a quarter interval later) included: the owner was extending
            // throughout. A round that succeeded moved the validity, and the claim grows.
            let moved = guard.valid_until() > seen;
            seen = guard.valid_until();
            self.history.record(Event::Extend {
                client: self.name.clone(),
                token: token.clone(),
                started: polled,
                ended: now,
                valid_until: moved.then(|| self.history.at(seen)),
            });
            if moved {
                renewals += 1;
                self.reader.check(&self.name, &guard).await;
            }
            polled = now;
        }
        let lost = !guard.is_valid();
        let released = self.release(guard, &token, tally).await;
        // A renewal may have been on its way when the loop ended: its PEXPIREs land before
        // the release's deletes, so the owner was extending until the release was done.
        self.history.record(Event::Extend {
            client: self.name.clone(),
            token: token.clone(),
            started: polled,
            ended: self.history.now(),
            valid_until: None,
        });
        // Categories, not counts: the summary counts outcomes.
        Ok(match (lost, renewals) {
            (true, _) => format!("lost, {released}"),
            (false, 0) => format!("{released}, never renewed"),
            (false, _) => format!("{released}, renewed"),
        })
    }

    /// Two holds of one owner (the second nested in the first, or both taken at once), a
    /// write under each, released in a random order with a write under the remaining one
    /// in between.
    async fn reentrant(
        &self,
        owner: &Owner,
        at_once: bool,
        rng: &mut StdRng,
        tally: &mut Tally,
    ) -> Result<String, LabError> {
        let options = LockOptions::default();
        let take = || self.client.lock_reentrant(KEY, owner, &options);
        let mut holds: Vec<(LockGuard, String)> = Vec::new();
        let results = if at_once {
            let stagger = Duration::from_micros(rng.gen_range(0..2000));
            let (first, second) = tokio::join!(take(), async {
                tokio::time::sleep(stagger).await;
                take().await
            });
            vec![first, second]
        } else {
            let first = take().await;
            if first.is_err() {
                vec![first]
            } else {
                // Recorded before the second call starts, so the fencing rule orders them.
                let first = self.won(first, tally)?.expect("won");
                let token = first.lock().token().as_str().to_owned();
                holds.push((first, token));
                vec![take().await]
            }
        };
        for result in results {
            if let Some(guard) = self.won(result, tally)? {
                let token = guard.lock().token().as_str().to_owned();
                holds.push((guard, token));
            }
        }
        if holds.is_empty() {
            return Ok("not acquired".into());
        }
        let count = holds.len();
        // One owner writes under one hold at a time: its holds share the key, not the
        // resource's read-modify-write.
        for (guard, token) in &holds {
            self.write(guard, token, tally).await;
        }
        if count == 2 && rng.gen_bool(0.5) {
            holds.swap(0, 1);
        }
        let mut released = Vec::new();
        while let Some((guard, token)) = holds.pop() {
            released.push(self.release(guard, &token, tally).await);
            if let Some((guard, token)) = holds.last() {
                // The other hold must still protect the key.
                self.write(guard, token, tally).await;
            }
        }
        let all_ok = released.iter().all(|r| r == "ok");
        Ok(format!(
            "{} ({count} hold{})",
            if all_ok { "ok" } else { "ok, a release failed" },
            if count == 1 { "" } else { "s" }
        ))
    }
}

/// A short name for why an extension failed.
fn kind(error: &Error) -> &'static str {
    match error {
        Error::LockLost { .. } => "lost",
        Error::Round(_) => "no quorum",
        _ => "error",
    }
}
