//! The client's waiters by key, and what a release message does to them: wake the oldest
//! waiter of a released key once per release (not once per node that announced it), wake a
//! fair queue's next waiter once a quorum of nodes announced it, count a hand-over's nodes.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

/// One waiter's wake-up: a `Notify` permit, and whether one was handed out and not yet
/// taken (so that a waiter who leaves without taking it passes it on); for a fair waiter,
/// the hand-over it expects and the nodes that made it; for a reentrant lock's waiter, its
/// owner.
#[derive(Debug, Default)]
pub(super) struct WakeUp {
    pub(super) notify: Notify,
    pub(super) pending: AtomicBool,
    pub(super) handover: Mutex<Handed>,
    pub(super) owner: Option<Arc<str>>,
}

/// The hand-over a fair waiter expects (its last attempt's token), and the nodes (by index)
/// that said they handed the key over under it.
#[derive(Debug, Default)]
pub(super) struct Handed {
    pub(super) expected: Option<String>,
    pub(super) nodes: Vec<usize>,
}

impl WakeUp {
    pub(super) fn wake(&self) {
        self.pending.store(true, Ordering::SeqCst);
        self.notify.notify_one();
    }
}

/// One registered waiter: its id, its wake-up, and its id in the key's fair queue.
pub(super) type Entry = (u64, Arc<WakeUp>, Option<Arc<str>>);

/// The waiters by key, oldest first, and the releases seen lately.
#[derive(Debug, Default)]
pub(super) struct Registry {
    pub(super) waiters: HashMap<String, VecDeque<Entry>>,
    /// Recent releases as `"<token> <key>"` (and the next waiter, for a fair lock), with
    /// the nodes that announced each, to wake once per released key and not once per node:
    /// each release is published on every node that held the key. The key is part of the
    /// entry because a multi-key lock releases all its keys under one token, and each key
    /// has waiters of its own. Nodes, not messages, are counted: a leave that a node did
    /// not answer in time is sent to it again, and where it had run, it publishes again.
    /// `seen_order` evicts the oldest when [`SEEN_RELEASES`] are remembered.
    pub(super) seen: HashMap<String, Vec<usize>>,
    pub(super) seen_order: VecDeque<String>,
    /// The node set's quorum. A fair queue's next waiter is woken once this many nodes
    /// announced the release: then the key is gone from enough nodes for it to win, while
    /// at the first announcement its round would race the release on the others and lose.
    pub(super) quorum: usize,
}

/// How many recent released keys are remembered to drop the copies from other nodes.
pub(super) const SEEN_RELEASES: usize = 4096;

impl Registry {
    /// A release of `key` (by the lock with `token`) was announced by node `node`, naming the
    /// next waiter of the key's fair queue when it has one (`head`).
    pub(super) fn wake(&mut self, node: usize, token: &str, key: &str, head: Option<&str>) {
        // Most messages are for keys nobody here waits for: drop those before any other work.
        let list = match (self.waiters.get(key), head) {
            (Some(list), _) => list,
            // A semaphore's waiters wait under its name, and a permit's release names the
            // permit: a message that names one of this client's waiters as the head (only
            // its client hears those) wakes it wherever it waits.
            (None, Some(head)) => {
                let waits = |list: &&VecDeque<Entry>| {
                    list.iter()
                        .any(|(_, _, fair)| fair.as_deref() == Some(head))
                };
                match self.waiters.values().find(waits) {
                    Some(list) => list,
                    None => return,
                }
            }
            (None, None) => return,
        };
        // With a head, this client wakes that waiter if it has it, or else its oldest
        // waiter outside the queue; without one, its oldest waiter.
        let chosen = match head {
            Some(head) => list
                .iter()
                .find(|(_, _, fair)| fair.as_deref() == Some(head))
                .or_else(|| list.iter().find(|(_, _, fair)| fair.is_none())),
            None => list.front(),
        };
        let Some((_, chosen, _)) = chosen else {
            return;
        };
        // Nodes whose queues differ name different heads: each is counted on its own.
        let (release, wake_at) = match head {
            Some(head) => (format!("{token} {key} {head}"), self.quorum.max(1)),
            None => (format!("{token} {key}"), 1),
        };
        let announced = match self.seen.get_mut(&release) {
            Some(nodes) if nodes.contains(&node) => return,
            Some(nodes) => {
                nodes.push(node);
                nodes.len()
            }
            None => {
                if self.seen_order.len() == SEEN_RELEASES {
                    if let Some(oldest) = self.seen_order.pop_front() {
                        self.seen.remove(&oldest);
                    }
                }
                self.seen.insert(release.clone(), vec![node]);
                self.seen_order.push_back(release);
                1
            }
        };
        if announced == wake_at {
            chosen.wake();
        }
    }

    /// Node `node` handed `key` over to waiter `head` of this client under the token
    /// `handed`. Counted when it is the hand-over the waiter expects; the waiter is woken
    /// by the first node that made it (to bound its wait for the others, see
    /// [`Waiter::handed_partly`](super::Waiter::handed_partly)) and once a quorum did. One for an older attempt of the
    /// waiter's wakes it at once: its next round takes the key on there.
    pub(super) fn handed(&mut self, node: usize, head: &str, handed: &str, key: &str) {
        let Some(list) = self.waiters.get(key) else {
            return;
        };
        let Some((_, slot, _)) = list
            .iter()
            .find(|(_, _, fair)| fair.as_deref() == Some(head))
        else {
            return;
        };
        let mut state = slot.handover.lock().expect("hand-over lock");
        if state.expected.as_deref() != Some(handed) {
            drop(state);
            slot.wake();
            return;
        }
        if !state.nodes.contains(&node) {
            state.nodes.push(node);
            // Woken at the first node and at the quorum: the waiter then holds the lock and
            // does not wait for the last nodes (see `Redlock::handed_over`), which are
            // still counted.
            let counted = state.nodes.len();
            if counted == 1 || counted == self.quorum.max(1) {
                drop(state);
                slot.wake();
            }
        }
    }

    /// Releases may have been missed: wake the oldest waiter of every key.
    pub(super) fn wake_all(&self) {
        for list in self.waiters.values() {
            if let Some((_, slot, _)) = list.front() {
                slot.wake();
            }
        }
    }

    /// Removes waiter `id` from the lists of `keys`; when it held a wake-up it did not use,
    /// the next waiter of each key gets one instead.
    pub(super) fn remove(&mut self, id: u64, keys: &[String], slot: &WakeUp) {
        let unused = slot.pending.load(Ordering::SeqCst);
        for key in keys {
            if let Some(list) = self.waiters.get_mut(key) {
                list.retain(|(other, _, _)| *other != id);
                match list.front() {
                    None => {
                        self.waiters.remove(key);
                    }
                    Some((_, next, _)) if unused => next.wake(),
                    Some(_) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiter(registry: &mut Registry, id: u64, keys: &[&str]) -> Arc<WakeUp> {
        let slot = Arc::new(WakeUp::default());
        for key in keys {
            registry
                .waiters
                .entry(key.to_string())
                .or_default()
                .push_back((id, slot.clone(), None));
        }
        slot
    }

    fn fair_waiter(registry: &mut Registry, id: u64, key: &str, fair: &str) -> Arc<WakeUp> {
        let slot = Arc::new(WakeUp::default());
        registry
            .waiters
            .entry(key.to_string())
            .or_default()
            .push_back((id, slot.clone(), Some(Arc::from(fair))));
        slot
    }

    #[test]
    fn a_fair_release_wakes_the_named_waiter_only() {
        let mut registry = Registry::default();
        let first = fair_waiter(&mut registry, 1, "k", "w1");
        let second = fair_waiter(&mut registry, 2, "k", "w2");
        // Another client's waiter is next: this client wakes nobody.
        registry.wake(0, "t1", "k", Some("w9"));
        assert!(!woken(&first) && !woken(&second));
        // This client's second waiter is next, although the first is older here.
        registry.wake(0, "t2", "k", Some("w2"));
        assert!(!woken(&first) && woken(&second));
        take(&second);
        // Another node whose queue names another head wakes that one too, once.
        registry.wake(1, "t2", "k", Some("w1"));
        registry.wake(2, "t2", "k", Some("w1"));
        registry.wake(1, "t2", "k", Some("w2"));
        assert!(woken(&first) && !woken(&second));
        // A waiter outside the queue on the same key is woken by a release naming a head
        // it does not have, so mixed use never leaves it without wake-ups.
        let plain = waiter(&mut registry, 3, &["k"]);
        registry.wake(0, "t3", "k", Some("w9"));
        assert!(woken(&plain));
    }

    /// A permit's release names the permit and the semaphore's next waiter, which waits
    /// under the semaphore's name: it is woken all the same, at the quorum.
    #[test]
    fn a_head_waiting_under_another_key_is_woken_by_a_message_naming_it() {
        let mut registry = Registry {
            quorum: 2,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "jobs", "w1");
        registry.wake(0, "t", "jobs:2", Some("w1"));
        assert!(!woken(&head));
        registry.wake(1, "t", "jobs:2", Some("w1"));
        assert!(woken(&head));
        // A message naming no waiter of this client, or none at all, wakes nobody.
        let other = fair_waiter(&mut registry, 2, "jobs", "w2");
        for node in 0..2 {
            registry.wake(node, "u", "jobs:1", Some("w9"));
            registry.wake(node, "v", "jobs:1", None);
        }
        assert!(!woken(&other));
    }

    #[test]
    fn a_fair_head_is_woken_once_a_quorum_of_nodes_announced_the_release() {
        let mut registry = Registry {
            quorum: 3,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "k", "w1");
        registry.wake(0, "t1", "k", Some("w1"));
        registry.wake(1, "t1", "k", Some("w1"));
        assert!(!woken(&head), "woken before the key was gone from a quorum");
        registry.wake(2, "t1", "k", Some("w1"));
        assert!(woken(&head));
        take(&head);
        registry.wake(3, "t1", "k", Some("w1"));
        registry.wake(4, "t1", "k", Some("w1"));
        assert!(!woken(&head), "woken again by the last nodes");
    }

    /// Nodes count towards the quorum, not messages. A leave that a node did not answer in
    /// time is sent to it again, and where it had run it passes the key on again: copies
    /// from one node must not reach the quorum while the key is free on fewer nodes (the
    /// real quorum-th node's message would then count past it and wake nobody).
    #[test]
    fn copies_of_one_nodes_announcement_count_once() {
        let mut registry = Registry {
            quorum: 3,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "k", "w1");
        for _ in 0..3 {
            registry.wake(0, "leave-1", "k", Some("w1"));
        }
        registry.wake(1, "leave-1", "k", Some("w1"));
        assert!(!woken(&head), "woken with the key free on two nodes");
        registry.wake(2, "leave-1", "k", Some("w1"));
        assert!(woken(&head), "not woken at the quorum-th node");
    }

    /// Two leaves of one waiter that each pass the key on to the same next waiter (a head
    /// that stepped back twice while it was next) have tokens of their own, and each wakes it.
    #[test]
    fn each_announcement_under_its_own_token_wakes_the_head_again() {
        let mut registry = Registry {
            quorum: 2,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "k", "w1");
        for token in ["leave-1", "leave-2"] {
            registry.wake(0, token, "k", Some("w1"));
            registry.wake(1, token, "k", Some("w1"));
            assert!(woken(&head), "{token} did not wake the head");
            take(&head);
        }
    }

    fn handed_nodes(slot: &WakeUp) -> Vec<usize> {
        slot.handover.lock().unwrap().nodes.clone()
    }

    fn expect(slot: &WakeUp, handed: &str) {
        let mut state = slot.handover.lock().unwrap();
        state.expected = Some(handed.into());
        state.nodes.clear();
    }

    #[test]
    fn a_fair_waiter_is_woken_by_the_first_node_and_the_quorum_that_handed_it_the_key() {
        let mut registry = Registry {
            quorum: 3,
            ..Registry::default()
        };
        let head = fair_waiter(&mut registry, 1, "k", "w1");
        let other = fair_waiter(&mut registry, 2, "k", "w2");
        expect(&head, "w1~2");
        // The first node wakes it, to bound its wait for the others.
        registry.handed(0, "w1", "w1~2", "k");
        assert!(woken(&head) && !woken(&other));
        take(&head);
        registry.handed(0, "w1", "w1~2", "k");
        registry.handed(4, "w1", "w1~2", "k");
        assert!(!woken(&head), "two distinct nodes are no quorum");
        registry.handed(2, "w1", "w1~2", "k");
        assert!(woken(&head) && !woken(&other));
        assert_eq!(handed_nodes(&head), vec![0, 4, 2]);
        take(&head);
        // The last nodes are counted, without waking it again.
        registry.handed(3, "w1", "w1~2", "k");
        assert!(!woken(&head), "woken again past the quorum");
        assert_eq!(handed_nodes(&head), vec![0, 4, 2, 3]);
        // A hand-over for an older attempt is not counted, but wakes the waiter: its next
        // round takes the key on.
        registry.handed(1, "w1", "w1~1", "k");
        assert!(woken(&head));
        assert_eq!(handed_nodes(&head).len(), 4);
        // Another client's waiter, or another key: nothing.
        registry.handed(1, "w9", "w9~1", "k");
        registry.handed(1, "w2", "w2~1", "other-key");
        assert!(!woken(&other));
    }

    fn woken(slot: &WakeUp) -> bool {
        slot.pending.load(Ordering::SeqCst)
    }

    /// What `Waiter::released` does once its permit arrived.
    fn take(slot: &WakeUp) {
        slot.pending.store(false, Ordering::SeqCst);
    }

    #[test]
    fn releases_of_keys_nobody_waits_for_cost_no_memory() {
        let mut registry = Registry::default();
        for i in 0..10 {
            registry.wake(0, &format!("t{i}"), "k", None);
        }
        assert!(registry.seen.is_empty() && registry.seen_order.is_empty());
    }

    #[test]
    fn one_release_wakes_the_oldest_waiter_once_whatever_the_number_of_nodes() {
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["k"]);
        let second = waiter(&mut registry, 2, &["k"]);
        let other = waiter(&mut registry, 3, &["other"]);
        for node in 0..5 {
            registry.wake(node, "t1", "k", None);
        }
        assert!(woken(&first));
        assert!(!woken(&second) && !woken(&other));
        take(&first);
        // The copies from the other nodes do not wake anybody again.
        registry.wake(5, "t1", "k", None);
        assert!(!woken(&first) && !woken(&second));
        // The next release goes to the oldest waiter again: it keeps its place.
        registry.wake(0, "t2", "k", None);
        assert!(woken(&first) && !woken(&second));
    }

    #[test]
    fn a_waiter_that_leaves_with_an_unused_wake_up_passes_it_on() {
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["a", "b"]);
        let second = waiter(&mut registry, 2, &["a"]);
        let third = waiter(&mut registry, 3, &["b"]);
        registry.wake(0, "t1", "a", None);
        registry.remove(1, &["a".into(), "b".into()], &first);
        assert!(woken(&second) && woken(&third));

        // A waiter that took its wake-up (it won, or gave up later) passes nothing on.
        let mut registry = Registry::default();
        let first = waiter(&mut registry, 1, &["a"]);
        let second = waiter(&mut registry, 2, &["a"]);
        registry.wake(0, "t1", "a", None);
        take(&first);
        registry.remove(1, &["a".into()], &first);
        assert!(!woken(&second));
        registry.remove(2, &["a".into()], &second);
        assert!(registry.waiters.is_empty());
    }

    #[test]
    fn a_multi_key_release_wakes_a_waiter_of_each_key() {
        let mut registry = Registry::default();
        let on_a = waiter(&mut registry, 1, &["a"]);
        let on_b = waiter(&mut registry, 2, &["b"]);
        // One lock over a and b, released under one token, announced by two nodes.
        for node in 0..2 {
            registry.wake(node, "t1", "a", None);
            registry.wake(node, "t1", "b", None);
        }
        assert!(woken(&on_a) && woken(&on_b));
        take(&on_a);
        take(&on_b);
        registry.wake(2, "t1", "b", None);
        assert!(!woken(&on_b), "a copy from another node wakes nobody again");
    }

    #[test]
    fn a_lagging_reader_wakes_the_oldest_waiter_of_every_key() {
        let mut registry = Registry::default();
        let a1 = waiter(&mut registry, 1, &["a"]);
        let a2 = waiter(&mut registry, 2, &["a"]);
        let b1 = waiter(&mut registry, 3, &["b"]);
        registry.wake_all();
        assert!(woken(&a1) && woken(&b1) && !woken(&a2));
    }

    #[test]
    fn the_memory_of_seen_releases_is_bounded() {
        let mut registry = Registry::default();
        let slot = waiter(&mut registry, 1, &["k"]);
        for i in 0..SEEN_RELEASES + 10 {
            registry.wake(0, &format!("t{i}"), "k", None);
            assert!(woken(&slot));
            take(&slot);
        }
        assert_eq!(registry.seen.len(), SEEN_RELEASES);
        assert_eq!(registry.seen_order.len(), SEEN_RELEASES);
        // The oldest were forgotten, the newest are still recognised.
        assert!(!registry.seen.contains_key("t0 k"));
        registry.wake(0, &format!("t{}", SEEN_RELEASES + 9), "k", None);
        assert!(!woken(&slot));
    }
}
