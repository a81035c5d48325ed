//! The must-pass scenarios of the nemeses added for issue 17, in the suite's order: client
//! processes killed or stopped ([`super::holder`]), links that flap or drop one client's
//! replies for the whole run ([`super::links`]), minority clock steps ([`super::clocks`]) and
//! many clients ([`super::clients`]). Each runs on both backends: the signals go to a local
//! holder process and the link faults to the lab's proxies whatever the nodes are, and the
//! docker set has fake clocks too.

use std::time::Duration;

use super::super::fair_head::{fair_head_answers_late, FAIR_HEAD_CLIENTS};
use super::clients::{many_clients_fair_minority_paused, many_clients_minority_paused, MANY};
use super::clocks::minority_clock_jumps;
use super::holder::{holder_process_killed, holder_process_paused_writes_fenced};
use super::links::{asymmetric_replies_dropped, minority_links_flapping};
use super::{safe, FIVE};
use crate::backend::Setup;
use crate::lab::{Fencing, Timing};
use crate::scenario::Scenario;

pub(super) fn scenarios() -> Vec<Scenario> {
    vec![
        Scenario {
            timing: Timing {
                // Each round holds for two thirds of a TTL, then waits one out after the kill.
                ttl: Duration::from_millis(500),
                ..Timing::default()
            },
            ..safe(
                "holder_process_killed",
                "the holder is a separate process (the lab's own executable in holder mode) that extends its lock every third of the TTL; it is SIGKILLed right after an extension: two in-process clients win only after its last validity, within a TTL and a retry delay of the kill",
                holder_process_killed,
            )
        },
        Scenario {
            setup: Setup { nodes: 3, ..FIVE },
            clients: 2,
            fencing: Fencing::All,
            timing: Timing {
                // Each round waits this TTL out (the stopped holder).
                ttl: Duration::from_millis(300),
                ..Timing::default()
            },
            // In a soak, rounds until 20 s are up (about 25, two acquisitions each: a
            // process spawned, stopped past a TTL and resumed per round).
            soak: Some(Timing {
                ttl: Duration::from_millis(300),
                run_for: Duration::from_secs(20),
                ..Timing::default()
            }),
            ..safe(
                "holder_process_paused_writes_fenced",
                "the holder is a separate process with a fenced lock; SIGSTOPped between its validity check and its write until its keys are gone, while another client takes the lock and writes; SIGCONTed, its write carries the older token and the fenced resource rejects it",
                holder_process_paused_writes_fenced,
            )
        },
        Scenario {
            timing: Timing {
                // Three seconds of flapping, then two TTLs for keys stranded by a release
                // that found a link down to expire before the leftover scan.
                run_for: Duration::from_secs(5),
                ..Timing::default()
            },
            ..safe(
                "minority_links_flapping",
                "every client's links to two of five nodes go down and up every 250 ms (blackholed, then refused), out of step, for the first 3 s of a 5 s run (the last two TTLs let keys that a release could not reach expire before the leftover scan)",
                minority_links_flapping,
            )
        },
        safe(
            "asymmetric_replies_dropped",
            "requests reach the node but its replies never come back, for one client only (client 0 from nodes 0 and 1, client 1 from node 4) for the whole run, while the other clients see those nodes healthy",
            asymmetric_replies_dropped,
        ),
        Scenario {
            setup: Setup {
                fake_clock: true,
                ..FIVE
            },
            ..safe(
                "minority_clock_jumps",
                "two of five nodes' wall clocks step back 1.5 s and forward 250 ms (each forward once), with the clients' drift factor at 0.3 (302 ms of the 1 s TTL) to cover the forward steps",
                minority_clock_jumps,
            )
        },
        Scenario {
            clients: MANY,
            // Plain locks: with 32 clients sharing a few hundred acquisitions, a run now and
            // then gives no fenced client a lock (1 run in about 140 with the mix), and the
            // fencing rule would report that; fencing has its own scenarios.
            fencing: Fencing::Off,
            ..safe(
                "many_clients_minority_paused",
                "32 clients (separate Redlock instances, each with its own links) contend for one key while two of five nodes are paused and resumed; the notes report each client's share",
                many_clients_minority_paused,
            )
        },
        Scenario {
            clients: MANY,
            fencing: Fencing::Off,
            ..safe(
                "many_clients_fair_minority_paused",
                "many_clients_minority_paused with every lock in the fair queue (fair = true): the queue's scripts, expiry and targeted wake-ups under the pause; the notes report each client's share",
                many_clients_fair_minority_paused,
            )
        },
        Scenario {
            clients: FAIR_HEAD_CLIENTS,
            ..safe(
                "fair_head_answers_late",
                "three fair clients; from a fifth to 70 % of the run client 0's answers come three node timeouts late (its commands run at once): a head that cannot win steps back after three unrefused losses, and its leaves and late rollbacks leave nothing behind; the notes report each client's wins",
                fair_head_answers_late,
            )
        },
    ]
}
