//! The Markdown tables of a run: every figure with its ratios, and the targets.

use std::fmt::Write as _;

use crate::report::Results;
use crate::stats::fmt_us;

impl Results {
    pub fn markdown(&self) -> String {
        let mut md = String::new();
        let m = &self.machine;
        let _ = writeln!(md, "## Benchmark results ({} run)\n", self.mode);
        let _ = writeln!(
            md,
            "Measured {} on {} ({} cores), {}, {} RAM, {} (load average {} at the start, {} \
             at the end). Every contender ran in the same process against the same \
             redis-server nodes on loopback, started by the harness. Reproduce with `{}` (it \
             checks for redis-server, then runs `cargo bench --bench redlock`; `-- --help` \
             lists the flags).\n",
            m.date,
            m.cpu_model,
            m.cores,
            m.kernel,
            m.memory_total,
            m.redis_server,
            m.load_average_start,
            m.load_average_end,
            self.reproduce
        );
        let s = &self.settings;
        let _ = writeln!(
            md,
            "Settings: TTL {} ms for everyone. Per-node timeout: ours {} ms (its default), \
             rslock {}. Retry: ours {}; rslock {}. P2: {}. P3: {}. {}.\n",
            s.ttl_ms,
            s.ours_node_timeout_ms,
            s.rslock_node_timeout,
            s.ours_retry,
            s.rslock_retry,
            s.p2_fault,
            s.p3_fault,
            s.runtime
        );
        self.latency_table(&mut md);
        self.handoff_table(&mut md);
        self.throughput_table(&mut md);
        self.renewal_table(&mut md);
        self.permits_table(&mut md);
        self.read_write_table(&mut md);
        self.scale_table(&mut md);
        self.targets_table(&mut md);
        md
    }

    fn latency_table(&self, md: &mut String) {
        if self.latency.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "### P1-P3, P9: one lock+unlock cycle\n\n\
             P1 healthy nodes; P2 one node hung (SIGSTOP); P3 one node behind a proxy adding \
             latency; P9 three members that are whole clusters of two masters, without \
             replicas, then with one replica per master. P2 and P3 also list the control: ours on a second, healthy set of \
             nodes, measured in the same interleaved slices, so that it meets the same moments \
             of the machine; it is the healthy reference of their targets. Ratios compare ours \
             with the row's reference in the same scenario and N (median, then p99).\n\n\
             | Case | N | Contender | Per-node timeout | Cycles | Failed | Median | p99 | Max | ours / floor (median, p99) | ours / rslock (median, p99) |\n\
             |---|---|---|---|---:|---:|---:|---:|---:|---:|---:|"
        );
        for c in &self.latency {
            let reference = |subject: &str| {
                self.latency.iter().find(|r| {
                    r.scenario == c.scenario
                        && r.nodes == c.nodes
                        && r.subject == subject
                        && r.summary.samples > 0
                })
            };
            let ratio = |subject: &str| match reference(subject) {
                Some(r) if is_ours(c.subject) && c.summary.samples > 0 => format!(
                    "{} / {}",
                    times(c.summary.median_us / r.summary.median_us),
                    times(c.summary.p99_us / r.summary.p99_us)
                ),
                _ => String::new(),
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.scenario,
                c.nodes,
                c.label,
                c.node_timeout,
                c.summary.samples,
                c.summary.failures,
                cell(c.summary.samples, c.summary.median_us),
                cell(c.summary.samples, c.summary.p99_us),
                cell(c.summary.samples, c.summary.max_us),
                ratio("floor"),
                ratio("rslock"),
            );
        }
        md.push('\n');
    }

    fn handoff_table(&self, md: &mut String) {
        let Some(h) = &self.handoff else { return };
        let _ = writeln!(
            md,
            "### P4: contended hand-off\n\n\
             {} workers, each with its own client (one row of ours: one client shared by \
             the 8 workers), on one key; critical section {} ms (a tokio sleep, which lasts up to a timer tick longer; 0 = none). Hand-off: from the start of the holder's release to \
             the return of the next `lock` (by any worker: each worker calls `lock` again right \
             after its release, so it competes too); one round trip = one raw `SET NX` \
             fan-out to every node = {}. The critical section's real length (mean) and its \
             inverse, the most sections per second any lock could reach with hand-offs that \
             cost nothing, are in the last column.\n\n\
             | Contender | Workers | Critical sections/s | Hand-off median | p99 | Median in round trips | After release returned (median) | To another worker: share, median | Sections per worker (min-max) | Gave up | Overlaps | Section (mean), ceiling |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            h.workers
                .iter()
                .map(|w| w.to_string())
                .collect::<Vec<_>>()
                .join(" and "),
            h.critical_section_ms,
            fmt_us(h.round_trip_us)
        );
        for c in &h.cases {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {} | {} | {:.1} | {} | {:.0} %, {} | {}-{} | {} | {} | {}, {:.0}/s |",
                c.label,
                c.workers,
                c.per_second,
                cell(c.handoff.samples, c.handoff.median_us),
                cell(c.handoff.samples, c.handoff.p99_us),
                c.median_round_trips,
                cell(
                    c.handoff_after_release_returned.samples,
                    c.handoff_after_release_returned.median_us
                ),
                c.handoff_to_other.samples as f64 * 100.0 / c.handoff.samples.max(1) as f64,
                cell(c.handoff_to_other.samples, c.handoff_to_other.median_us),
                c.sections_per_worker_min,
                c.sections_per_worker_max,
                c.gave_up,
                c.overlaps,
                fmt_us(c.section_mean_us),
                1e6 / c.section_mean_us.max(1.0)
            );
        }
        md.push('\n');
        self.handoff_trace(md, h);
    }

    /// Ours' hand-offs to another worker, step by step (`handoff::Trace`).
    fn handoff_trace(&self, md: &mut String, h: &crate::handoff::Handoff) {
        let traced: Vec<_> = h
            .cases
            .iter()
            .filter_map(|c| c.trace.as_ref().map(|t| (c, t)))
            .collect();
        if traced.is_empty() {
            return;
        }
        md.push_str(
            "Ours' hand-offs to another worker, step by step (medians over those hand-offs): \
             the release call, its round from the first command sent to the decision (the \
             release's report), its first reply and the one that made its quorum, the call less its round (the \
             client's own work around the round), and the time from the release's return to \
             the next holder's `lock` return.\n\n\
             | Contender | Workers | Hand-offs | Release call | Its round | First reply | Quorum's reply | Client's own | Next `lock` after the release returned |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for (c, t) in traced {
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
                c.label,
                c.workers,
                t.samples,
                fmt_us(t.release_call_us),
                fmt_us(t.release_round_us),
                fmt_us(t.first_reply_us),
                fmt_us(t.quorum_reply_us),
                fmt_us(t.release_client_us),
                fmt_us(t.next_after_release_us)
            );
        }
        md.push('\n');
    }

    fn throughput_table(&self, md: &mut String) {
        let Some(t) = &self.throughput else { return };
        let _ = writeln!(
            md,
            "### P5: many keys\n\n\
             {} cycles in flight over distinct keys, one client. Servers' limit: {}.\n\n\
             | Contender | Cycles/s | Failed | Share of the servers' limit |\n|---|---:|---:|---:|",
            t.in_flight,
            t.server_limit
                .as_ref()
                .map_or("not measured".into(), |l| format!(
                    "{:.0} cycles/s ({})",
                    l.cycles_per_second, l.method
                ))
        );
        for c in &t.cases {
            let _ = writeln!(
                md,
                "| {} | {:.0} | {} | {} |",
                c.label,
                c.per_second,
                c.failures,
                c.share_of_limit
                    .map_or(String::new(), |s| format!("{:.0} %", s * 100.0))
            );
        }
        if let Some(l) = &t.server_limit {
            let _ = writeln!(
                md,
                "| servers' limit (redis-benchmark) | {:.0} | | 100 % |",
                l.cycles_per_second
            );
        }
        md.push('\n');
    }

    fn scale_table(&self, md: &mut String) {
        let Some(t) = &self.scale else { return };
        let _ = writeln!(
            md,
            "### P10: cluster members, as shards and client processes are added\n\n\
             Three members, each a cluster of the masters below (no replicas); each client \
             process runs P5's loop for ours ({} cycles in flight on keys of its own). \
             Servers' limit: `redis-benchmark` (with `--cluster` over clusters of several \
             masters) on every member at once, the slowest member's cycles/s.\n\n\
             | Masters per member | Client processes | Cycles/s | Failed | Servers' limit | Share |\n\
             |---:|---:|---:|---:|---:|---:|",
            t.in_flight_per_process
        );
        for c in &t.cases {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {} | {} | {} |",
                c.shards,
                c.processes,
                c.per_second,
                c.failures,
                c.server_limit
                    .map_or("not measured".into(), |l| format!("{l:.0}")),
                c.share_of_limit
                    .map_or(String::new(), |s| format!("{:.0} %", s * 100.0))
            );
        }
        md.push('\n');
    }

    fn permits_table(&self, md: &mut String) {
        let Some(p) = &self.permits else { return };
        let _ = writeln!(
            md,
            "### P7: a semaphore's permits under contention\n\n\
             {} workers, each with its own client, take turns holding for {:.0} ms: a plain \
             lock (one holder at a time), then a permit of a semaphore of four: ours (a \
             Redlock key per permit, outside and in its fair queue), and the design it was \
             chosen over, a per-node limit of \
             floor(k*q/N) = 2 holders on every node (the bench's model with raw fred; at most \
             floor(2*5/3) = 3 hold at once, below the four checked).\n\n\
             | Contender | Admits | Acquired/s | Holders on average | At most | Failed |\n\
             |---|---:|---:|---:|---:|---:|",
            p.workers, p.critical_section_ms
        );
        for c in &p.cases {
            let _ = writeln!(
                md,
                "| {} | {} | {:.0} | {:.2} ({:.0} % of {}) | {} | {} |",
                c.label,
                c.admits,
                c.per_second,
                c.mean_holders,
                100.0 * c.mean_holders / f64::from(c.admits),
                c.admits,
                c.most_holders,
                c.failures
            );
        }
        md.push('\n');
    }

    fn read_write_table(&self, md: &mut String) {
        let Some(p) = &self.read_write else { return };
        let _ = writeln!(
            md,
            "### P8: a read-write lock under contention\n\n\
             {} workers, each with its own client, on one lock: each cycle reads with \
             probability {:.1} (else writes), drawn from a seeded generator per worker, and \
             holds for {:.0} ms. A plain lock under the same draws (every cycle alone), then \
             ours' read-write lock with release notifications on (a writer's release and the \
             last reader's are announced to every client) and off (polling), and in its fair \
             queue. A writer beside any other holder fails the run.\n\n\
             | Contender | Reads/s | Writes/s | Cycles/s | Holders on average | At most | Readers at most | Overlaps | Failed |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|",
            p.workers, p.read_share, p.critical_section_ms
        );
        for c in &p.cases {
            let readers = if c.shared_reads {
                c.most_readers.to_string()
            } else {
                "(alone)".to_string()
            };
            let _ = writeln!(
                md,
                "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {} | {} |",
                c.label,
                c.reads_per_second,
                c.writes_per_second,
                c.cycles_per_second,
                c.mean_holders,
                c.most_holders,
                readers,
                c.overlaps,
                c.failures
            );
        }
        md.push('\n');
    }

    fn renewal_table(&self, md: &mut String) {
        let Some(first) = self.renewal.first() else {
            return;
        };
        let _ = writeln!(
            md,
            "### P6: locks held under automatic renewal\n\n\
             One client with every default but the node timeout where stated (TTL {} ms, \
             renewed every {} ms, one batched extension per tick, up to {} locks per script \
             call), each case in a fresh process. CPU from /proc/PID/stat over the holding \
             period, as a share of one core, and per lock renewal (one per lock per renewal \
             interval); memory is \
             VmRSS, and the cost per lock is its growth over the second half of the \
             acquisitions (the first half also pays for the acquisition burst). Malloc \
             arenas: glibc's `MALLOC_ARENA_MAX` in the case's process (default: up to eight \
             per core, one per thread that allocates).\n\n\
             | Locks | Node timeout | Malloc arenas | Held for | Renewal script calls per node | Not acquired | Lost | CPU (client) | CPU per lock renewal | CPU (all servers) | RSS before | RSS with all locks | RSS at the end | RSS per lock |\n\
             |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            first.ttl_ms,
            first.renew_every_ms,
            redlock_core::EXTEND_BATCH_LOCKS,
        );
        let mib = |b: u64| b as f64 / 1048576.0;
        for r in &self.renewal {
            let _ = writeln!(
                md,
                "| {} | {} ms | {} | {:.0} s | {} | {} | {} | {:.2} % | {:.2} µs | {:.2} % | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.0} B |",
                r.locks,
                r.node_timeout_ms,
                r.malloc_arena_max
                    .map_or_else(|| "default".to_string(), |n| n.to_string()),
                r.hold_seconds,
                r.renewal_calls,
                r.not_acquired,
                r.lost,
                r.cpu_share * 100.0,
                r.cpu_us_per_lock_renewal,
                r.servers_cpu_share * 100.0,
                mib(r.rss_before_bytes),
                mib(r.rss_acquired_bytes),
                mib(r.rss_held_bytes),
                r.rss_bytes_per_lock,
            );
        }
        md.push('\n');
    }

    fn targets_table(&self, md: &mut String) {
        if self.targets.is_empty() {
            return;
        }
        let _ = writeln!(
            md,
            "### Targets\n\n| Target | Goal | Measured | Result | Why missed, and what would close it |\n|---|---|---|---|---|"
        );
        for t in &self.targets {
            let result = match t.met {
                Some(true) => "met",
                Some(false) => "**missed**",
                None => "not run",
            };
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} |",
                t.id, t.goal, t.measured, result, t.note
            );
        }
        md.push('\n');
    }
}

/// The rows that get ratios: our configurations, not the control.
fn is_ours(subject: &str) -> bool {
    subject.starts_with("ours") && subject != crate::latency::CONTROL.0
}

/// A ratio for the tables: `1.14x`, or `1/1416x` when far below one.
fn times(ratio: f64) -> String {
    if ratio >= 0.1 {
        format!("{ratio:.2}x")
    } else {
        format!("1/{:.0}x", 1.0 / ratio)
    }
}

fn cell(samples: u64, us: f64) -> String {
    if samples == 0 {
        "-".into()
    } else {
        fmt_us(us)
    }
}
