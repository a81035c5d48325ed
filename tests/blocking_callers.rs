//! Synchronous callers: the README's recipe (a multi-threaded runtime owned by the caller,
//! `block_on` per call) keeps a lock renewed while the calling thread does blocking work,
//! because renewal runs on the runtime's own worker thread.

mod common;

use std::time::Duration;

use redlock_testkit::NodeSet;

#[test]
fn a_lock_taken_with_block_on_is_renewed_while_the_thread_blocks() {
    // The recipe: one runtime for the program's life, with one worker thread of its own.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let set = runtime.block_on(NodeSet::start(3)).unwrap();
    let client = runtime.block_on(common::client(&set, |b| b.ttl(Duration::from_millis(600))));

    let guard = runtime.block_on(client.lock("sync-job")).unwrap();
    // Blocking work, outside the runtime, for three TTLs: renewal keeps the lock.
    std::thread::sleep(Duration::from_millis(1_800));
    assert!(guard.is_valid(), "renewed while the thread was blocked");
    assert!(runtime.block_on(guard.check()).unwrap());
    runtime.block_on(guard.release()).unwrap();
    assert!(runtime
        .block_on(set.nodes_holding("redlock:sync-job"))
        .is_empty());

    // A guard dropped inside `enter` is released in the background as usual (one dropped
    // on a plain thread too: `client_lifecycle` shows that).
    let guard = runtime.block_on(client.lock("sync-job")).unwrap();
    {
        let _inside = runtime.enter();
        drop(guard);
    }
    runtime.block_on(client.coordinator().quiesce());
    assert!(runtime
        .block_on(set.nodes_holding("redlock:sync-job"))
        .is_empty());
    runtime.block_on(client.shutdown());
}
