//! Test support for the redlock workspace: real `redis-server` processes on free loopback
//! ports, with process-level fault injection.
//!
//! Every integration test, example and benchmark of the workspace starts its Redis masters
//! through this crate:
//!
//! ```no_run
//! use redlock_testkit::{HarnessError, NodeSet};
//!
//! async fn example() -> Result<(), HarnessError> {
//!     let nodes = NodeSet::start(3).await?;
//!     let urls = nodes.urls(); // "redis://127.0.0.1:PORT", one per node
//!     # let _ = urls;
//!     nodes.node(0).set("k", "v", Some(10_000)).await?;
//!     nodes.node(1).pause()?; // SIGSTOP: requests to it now time out
//!     assert_eq!(nodes.nodes_holding("k").await, vec![0]);
//!     nodes.node(1).resume()?;
//!     nodes.node(2).kill()?; // SIGKILL
//!     nodes.node(2).restart().await?; // same port, data gone (no persistence by default)
//!     Ok(())
//! } // dropping `nodes` kills and reaps every process and removes the data directories
//! # fn main() {}
//! ```
//!
//! # Finding redis-server
//! `$REDIS_SERVER` (a path, or a name looked up on `PATH`), else `redis-server` on `PATH`.
//! On Debian: `apt-get install -y redis-server`.
//!
//! # Process hygiene
//! Each node runs `redis-server --port P --bind 127.0.0.1 --daemonize no --save "" ...` with its
//! own temporary `--dir` and a `--logfile` inside it (start-up errors quote its tail). Nodes are
//! killed and reaped when dropped, also when a test panics (unwinding drops them). If the test
//! process itself is killed, `PR_SET_PDEATHSIG(SIGKILL)` takes the servers down with it. That
//! signal fires when the *thread* that spawned the server exits: servers are spawned from the
//! thread calling [`NodeSet::start`] / [`Node::restart`] (a test thread, a `block_on` thread or
//! a tokio worker, all living as long as the test). Do not keep nodes started from a
//! short-lived thread such as a `spawn_blocking` one.
//!
//! # Passwords, ACL users, TLS and unix sockets
//! Production-like connectivity, per [`NodeOptions`]; the plain `--port` on `127.0.0.1` always
//! stays open, because the harness probes and inspects every node through it.
//!
//! - [`NodeOptions::password`] (`--requirepass`): outside clients get `NOAUTH` until they
//!   authenticate; the harness's own connections (readiness probe, [`RedisAt`],
//!   [`NodeSet::nodes_holding`]) send `AUTH` themselves, and [`Node::url`] carries the
//!   password: `redis://:PASSWORD@127.0.0.1:PORT`.
//! - [`NodeOptions::acl_users`]: rule lines such as `"locker on >secret ~redlock:* &* +set"`,
//!   each passed as a `--user` directive, so the users exist from the start; connect as one
//!   with [`Node::url_as`], [`Node::tls_url_as`] or [`Node::unix_url_as`].
//! - [`NodeOptions::tls`] ([`TlsNodeOptions`]): a TLS listener on a second port
//!   ([`Node::tls_port`], [`Node::tls_url`]: `rediss://localhost:TLS_PORT`), optionally
//!   requiring client certificates. The set generates a [`TestPki`] at start
//!   ([`NodeSet::pki`]): one CA for all its nodes, a client certificate for mutual TLS, and an
//!   unrelated CA (and client certificate) for "wrong CA" tests, as PEM text and files.
//! - [`NodeOptions::unix_socket`]: `<node dir>/redis.sock` with permissions `700`
//!   ([`Node::unix_socket`], [`Node::unix_url`]: `redis+unix:///DIR/redis.sock`, which fred
//!   reads with its `unix-sockets` feature).
//!
//! Ports, socket paths, certificates and credentials stay the same across restarts. No
//! secret (password, ACL password, private key) shows in the harness's `Debug` output or
//! errors: log tails have them replaced by `***`. [`find_redis_cli`] locates `redis-cli` for
//! tests that act as an outside client.
//!
//! ```no_run
//! use redlock_testkit::{HarnessError, NodeOptions, NodeSet, TlsNodeOptions};
//!
//! async fn example() -> Result<(), HarnessError> {
//!     let opts = NodeOptions {
//!         password: Some("pw".to_owned()),
//!         acl_users: vec!["locker on >secret ~redlock:* &* +set +eval".to_owned()],
//!         tls: Some(TlsNodeOptions::default()),
//!         unix_socket: true,
//!         ..NodeOptions::default()
//!     };
//!     let nodes = NodeSet::start_with(3, opts).await?;
//!     let tls_urls = nodes.tls_urls(); // Some(["rediss://:pw@localhost:PORT", ...])
//!     let ca_file = nodes.pki().map(|pki| pki.ca_path()); // what clients trust
//!     let locker = nodes.node(0).url_as("locker", "secret");
//!     # let _ = (tls_urls, ca_file, locker);
//!     Ok(())
//! }
//! # fn main() {}
//! ```
//!
//! # One interface for both node sets
//! [`Nodes`] is what a [`NodeSet`] and a [`DockerSet`] have in common: names, addresses,
//! [`RedisAt`] handles and fake clocks by node index, and every fault as an async method
//! (kill, pause, resume, restart, delayed restart, partition, heal, key loss). A test or a
//! fault scenario written against `&dyn Nodes` runs on local processes and on containers
//! alike; see the table on [`Nodes`] for what each fault does on each set.
//!
//! # Fake clocks
//! With [`NodeOptions::fake_clock`] each server runs with a small LD_PRELOAD library
//! ([`ClockShim`], compiled from C on first use) that fakes its wall clock, which is what Redis
//! expires keys by. [`Node::clock`] returns the [`ClockControl`] that makes that clock jump
//! ([`ClockControl::jump`]) or run faster or slower ([`ClockControl::set_rate`]) at run time,
//! to break Redlock's assumption of similar clock rates on purpose. Monotonic clocks stay real.
//!
//! # Network faults
//! A [`FaultProxy`] is a loopback TCP proxy in front of one node whose [`LinkFault`] is switched
//! at run time: pass, latency per direction, blackhole, held or dropped replies, resets.
//! [`Links`] starts one proxy per (client, node) pair, so each client can see its own partition:
//! client `c` connects through `links.urls(c)` and `links.link(c, n).set(LinkFault::Blackhole)`
//! cuts it off from node `n` only.
//!
//! # Key loss
//! [`RedisAt`] inspects any server by address (a [`Node`] hands one out with [`Node::redis`]).
//! [`RedisAt::evict_all`] evicts every key for real (a moment of `maxmemory` 1 byte, the
//! configuration restored afterwards); [`Node::restart_after`] is the delayed restart, and a node
//! started with `appendonly_always` survives [`Node::restart`] with its keys.
//!
//! # Docker backend
//! [`DockerSet::up`] runs the five masters of the repository's `docker-compose.yml` in
//! containers (`127.0.0.1:7101..7105`, image built locally by `docker/build-image.sh`) with
//! container faults: `docker kill`/`start`, delayed restart, `pause`, network `disconnect`, and
//! per-container fake clocks ([`DockerOptions::fake_clock`]), all through [`Nodes`]. It needs
//! Docker Engine and docker-compose v1; [`DockerSet::available`] says what is missing.
//!
//! # Clusters as one member
//! [`ClusterSet`] starts a Redis Cluster of local processes (masters and replicas on free
//! ports) and [`DockerCluster`] the one of `docker-compose.cluster.yml` in containers; both
//! give the member's URL and the cluster's own faults: a shard failed over
//! ([`ClusterSet::fail_over`]), its replication held back, a slot moved (local only).
//!
//! # PostgreSQL, the fenced resource
//! [`Postgres::start`] runs a real PostgreSQL (`initdb` into a temporary directory, then
//! `postgres` on a free loopback port, trust authentication as [`POSTGRES_USER`]) so tests can
//! check fencing tokens where they matter, in the resource's own atomic write:
//! `UPDATE ... SET ..., fence = $token WHERE id = $id AND fence < $token`. The binaries come
//! from `$REDLOCK_PG_BIN`, `PATH`, `pg_config --bindir` or Debian's
//! `/usr/lib/postgresql/<major>/bin` (`apt-get install -y postgresql`); as root, the server
//! runs as the `postgres` system user, since PostgreSQL refuses to run as root.
//!
//! Linux only (prctl, `/proc`). No timing guarantees are made beyond the documented timeouts:
//! start-up waits up to [`READY_TIMEOUT`], inspection calls up to about [`INSPECT_TIMEOUT`].
#![deny(missing_docs, missing_debug_implementations)]
#![deny(unsafe_code)]

mod access;
mod clock;
mod cluster;
mod command;
mod docker;
mod error;
mod faults;
mod inspect;
mod node;
mod nodes;
mod options;
mod pki;
mod poll;
mod port;
mod postgres;
mod process;
mod proxy;
mod ready;
mod server;
mod set;
mod urls;

pub use clock::{ClockControl, ClockShim};
pub use cluster::{ClusterSet, ClusterShape, Failover, MemberSet, CLUSTER_SLOTS};
pub use docker::{DockerCluster, DockerOptions, DockerSet};
pub use error::HarnessError;
pub use inspect::{RedisAt, INSPECT_TIMEOUT};
pub use node::{Node, READY_TIMEOUT};
pub use nodes::Nodes;
pub use options::{NodeOptions, TlsNodeOptions};
pub use pki::TestPki;
pub use poll::eventually;
pub use postgres::{
    Postgres, INITDB_TIMEOUT, PG_BIN_ENV, POSTGRES_DB, POSTGRES_READY_TIMEOUT, POSTGRES_USER,
};
pub use process::{find_redis_cli, REDIS_SERVER_ENV};
pub use proxy::{FaultProxy, LinkFault, LinkStats, Links};
pub use server::{server_binary, skip_without_tls, ServerBinary};
pub use set::NodeSet;

// The README's examples, compiled as doc tests so that they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
