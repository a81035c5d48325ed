//! Two `redlock run` processes contending for one key never run their commands at the same
//! time. Each command appends its start and end times (and its lock token, unique per
//! acquisition) to one file; the intervals must be disjoint.

mod common;

use std::path::Path;

use common::{assert_exit, output, redlock};
use redlock_testkit::NodeSet;

/// One command's critical section, in nanoseconds since the epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Interval {
    start: u128,
    end: u128,
}

/// Every pair of intervals that overlap.
fn overlaps(intervals: &[Interval]) -> Vec<(Interval, Interval)> {
    let mut sorted = intervals.to_vec();
    sorted.sort_by_key(|i| i.start);
    let mut found = Vec::new();
    for (i, a) in sorted.iter().enumerate() {
        for b in &sorted[i + 1..] {
            if b.start < a.end {
                found.push((*a, *b));
            }
        }
    }
    found
}

/// Reads `token start|end nanos` lines into one interval per token.
fn intervals(log: &Path) -> Vec<Interval> {
    let text = std::fs::read_to_string(log).expect("the commands wrote the log");
    let mut open = std::collections::HashMap::new();
    let mut done = Vec::new();
    for line in text.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let [token, what, nanos] = fields[..] else {
            panic!("unexpected line {line:?}");
        };
        let nanos: u128 = nanos.parse().expect("nanoseconds");
        match what {
            "start" => assert!(
                open.insert(token.to_string(), nanos).is_none(),
                "token reused: {token}"
            ),
            "end" => done.push(Interval {
                start: open.remove(token).expect("an end after its start"),
                end: nanos,
            }),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(open.is_empty(), "sections that never ended: {open:?}");
    done
}

#[test]
fn the_check_finds_an_overlapping_pair() {
    let a = Interval {
        start: 100,
        end: 200,
    };
    let b = Interval {
        start: 150,
        end: 300,
    };
    let c = Interval {
        start: 300,
        end: 400,
    };
    assert_eq!(overlaps(&[c, b, a]), vec![(a, b)]);
    // Touching ends are not an overlap: one ended before the other started.
    assert!(overlaps(&[
        a,
        Interval {
            start: 200,
            end: 250
        }
    ])
    .is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_concurrent_runs_never_overlap() {
    const RUNS_EACH: usize = 4;
    let set = NodeSet::start(3).await.expect("nodes start");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("sections.log");
    // `date +%s%N`: GNU date's nanoseconds. The sleep keeps each section long enough that
    // the other process is certainly waiting meanwhile.
    let section = format!(
        "echo \"$REDLOCK_TOKEN start $(date +%s%N)\" >> {log}; sleep 0.2; echo \"$REDLOCK_TOKEN end $(date +%s%N)\" >> {log}",
        log = log.display()
    );
    let contender = |set: &NodeSet| {
        let mut cmd = redlock(set);
        cmd.args([
            "run",
            "--wait",
            "60s",
            "shared-job",
            "--",
            "sh",
            "-c",
            &section,
        ]);
        cmd
    };
    let worker = |mut a: tokio::process::Command| async move {
        for _ in 0..RUNS_EACH {
            assert_exit(&output(&mut a).await, 0);
        }
    };
    tokio::join!(worker(contender(&set)), worker(contender(&set)));

    let sections = intervals(&log);
    assert_eq!(sections.len(), 2 * RUNS_EACH);
    assert_eq!(overlaps(&sections), vec![], "critical sections overlapped");
    // Released at the end of each run: nothing left on the nodes.
    assert!(set.nodes_holding("redlock:shared-job").await.is_empty());
}
