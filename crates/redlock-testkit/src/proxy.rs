//! A TCP proxy per (client, node) link whose behaviour is switched at run time: the
//! workspace's network-fault tool (loopback only, no kernel support such as netem needed).
//!
//! Each accepted client connection gets a fresh upstream connection and two tasks, one per
//! direction ([`pipe`]); an acceptor task owns the listener. The current fault lives in a
//! `watch` channel, so a task blocked on a held or dropped stream wakes up as soon as the fault
//! changes, and dropping the [`FaultProxy`] (the channel's sender) ends every task.

mod links;
mod pipe;

use std::fmt;
use std::future::poll_fn;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use crate::HarnessError;
pub use links::Links;
use pipe::{Conn, Direction};

/// Pause after a failed `accept` (e.g. out of file descriptors) so the acceptor does not spin.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(20);

/// What a link does to the traffic crossing it. Changed at run time with [`FaultProxy::set`].
///
/// A fault applies to bytes as the proxy reads them from a socket: bytes already waiting in a
/// delay line ([`LinkFault::Latency`]) or a hold buffer ([`LinkFault::HoldReplies`]) are still
/// delivered, in order, whatever fault comes next, except [`LinkFault::Refuse`], which resets
/// at once. A connection that lost bytes (or an end-of-stream) to a fault is reset with the
/// next change of fault, whatever the new fault is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkFault {
    /// Forward both ways at once.
    Pass,
    /// Forward both ways, each chunk delayed (order kept) by the given time per direction.
    Latency {
        /// Delay of the bytes the client sends (requests).
        to_server: Duration,
        /// Delay of the bytes the server sends (replies).
        to_client: Duration,
    },
    /// Keep connections open, forward nothing either way (bytes that arrive are dropped);
    /// new connections are accepted but nothing is forwarded. When the fault is lifted,
    /// connections that lost bytes are reset (a TCP stream cannot have a hole: a real
    /// partition ends the same way once retransmissions time out).
    Blackhole,
    /// Forward requests; keep the server's replies (in order, unbounded buffer) until the fault
    /// is changed to anything else, then deliver them (late) before applying the new fault.
    HoldReplies,
    /// Forward requests; drop the server's replies. Connections that lost reply bytes are reset
    /// when the fault is lifted.
    DropReplies,
    /// Reset (RST, SO_LINGER 0) every open connection now and every new one on accept.
    Refuse,
}

/// Counters of one link since it started. Bytes are counted when written to (forwarded),
/// discarded by (dropped) or put on hold by the proxy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkStats {
    /// Request bytes written to the server.
    pub forwarded_to_server: u64,
    /// Reply bytes written to the client.
    pub forwarded_to_client: u64,
    /// Request bytes dropped ([`LinkFault::Blackhole`], or the upstream was unreachable).
    pub dropped_to_server: u64,
    /// Reply bytes dropped ([`LinkFault::Blackhole`], [`LinkFault::DropReplies`]).
    pub dropped_to_client: u64,
    /// Reply bytes put on hold by [`LinkFault::HoldReplies`] (delivered later; requests are
    /// never held, so there is no `held_to_server`).
    pub held_to_client: u64,
    /// Client connections accepted.
    pub connections_accepted: u64,
    /// Client connections ended with a reset (by a fault, by
    /// [`FaultProxy::reset_connections`], by an I/O error or an unreachable upstream).
    pub connections_reset: u64,
    /// Upstream connections that could not be established (the node is down).
    pub upstream_failures: u64,
}

/// The fault and the reset generation, sent to every task of a proxy.
#[derive(Clone, Copy, Debug)]
struct Control {
    fault: LinkFault,
    /// Bumped by [`FaultProxy::reset_connections`]; a connection accepted under an older
    /// value resets itself.
    resets: u64,
    /// Bumped by every change of `fault`: bytes lost under one fault reset their connection
    /// when this moves on, however late each direction of it notices.
    changes: u64,
}

/// What the tasks of one proxy share.
#[derive(Debug)]
struct Link {
    name: String,
    upstream: SocketAddr,
    open: AtomicUsize,
    counters: Counters,
}

#[derive(Debug, Default)]
struct Counters {
    forwarded: [AtomicU64; 2],
    dropped: [AtomicU64; 2],
    held: [AtomicU64; 2],
    accepted: AtomicU64,
    reset: AtomicU64,
    upstream_failures: AtomicU64,
}

impl Counters {
    fn add(counter: &AtomicU64, n: usize) {
        counter.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// The listener, shared with the acceptor task so that dropping the proxy closes the port
/// synchronously instead of at the acceptor's next turn on the runtime.
type ListenerSlot = Arc<Mutex<Option<TcpListener>>>;

/// A loopback TCP proxy in front of one upstream (a redis node) with a switchable
/// [`LinkFault`]. Start with [`FaultProxy::start`]; point the client at [`FaultProxy::url`].
///
/// Dropping it closes the listening port at once and ends every connection (closed normally)
/// and task shortly after, at the tasks' next turn on the runtime.
///
/// ```no_run
/// use std::net::SocketAddr;
/// use redlock_testkit::{FaultProxy, HarnessError, LinkFault, NodeSet};
///
/// async fn example() -> Result<(), HarnessError> {
///     let nodes = NodeSet::start(1).await?;
///     let upstream = SocketAddr::from(([127, 0, 0, 1], nodes.node(0).port()));
///     let proxy = FaultProxy::start("client-0->node-0", upstream).await?;
///     let url = proxy.url(); // give the client this URL instead of the node's
///     # let _ = url;
///     proxy.set(LinkFault::HoldReplies); // requests still reach the node, replies wait
///     proxy.heal(); // the held replies are delivered, late
///     Ok(())
/// }
/// # fn main() {}
/// ```
pub struct FaultProxy {
    link: Arc<Link>,
    addr: SocketAddr,
    control: watch::Sender<Control>,
    listener: ListenerSlot,
}

impl FaultProxy {
    /// Listens on `127.0.0.1:PORT` (a free port) and forwards each accepted connection to `upstream`
    /// (a fresh upstream connection per client connection). `name` appears in logs and
    /// errors, e.g. `"client-1->node-3"`. Starts with [`LinkFault::Pass`].
    ///
    /// Must run inside a tokio runtime (the proxy's tasks are spawned on it). If `upstream`
    /// cannot be reached when a client connects, that client connection is reset.
    pub async fn start(
        name: impl Into<String>,
        upstream: SocketAddr,
    ) -> Result<FaultProxy, HarnessError> {
        let name = name.into();
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(HarnessError::io(
                format!("start fault proxy {name} (upstream {upstream})"),
                io::Error::other(
                    "no tokio runtime is running; start proxies from a #[tokio::test] or \
                     inside Runtime::block_on",
                ),
            ));
        }
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .map_err(|e| {
                HarnessError::io(
                    format!(
                        "bind 127.0.0.1:0 for fault proxy {name} (upstream {upstream}); free \
                         loopback ports or raise the open-file limit"
                    ),
                    e,
                )
            })?;
        let addr = listener.local_addr().map_err(|e| {
            HarnessError::io(
                format!("read the listening address of fault proxy {name}"),
                e,
            )
        })?;
        let link = Arc::new(Link {
            name,
            upstream,
            open: AtomicUsize::new(0),
            counters: Counters::default(),
        });
        let (control, control_rx) = watch::channel(Control {
            fault: LinkFault::Pass,
            resets: 0,
            changes: 0,
        });
        let listener: ListenerSlot = Arc::new(Mutex::new(Some(listener)));
        tokio::spawn(accept_loop(
            Arc::clone(&listener),
            Arc::clone(&link),
            control_rx,
        ));
        tracing::debug!(link = %link.name, %addr, %upstream, "fault proxy listening");
        Ok(FaultProxy {
            link,
            addr,
            control,
            listener,
        })
    }

    /// The name given to [`FaultProxy::start`].
    pub fn name(&self) -> &str {
        &self.link.name
    }

    /// Where clients connect (127.0.0.1 and the proxy's port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.addr.port())
    }

    /// The address every connection is forwarded to.
    pub fn upstream(&self) -> SocketAddr {
        self.link.upstream
    }

    /// Switches the fault; it applies to open and future connections. Setting the current
    /// fault again changes nothing.
    pub fn set(&self, fault: LinkFault) {
        let changed = self.control.send_if_modified(|c| {
            let changed = c.fault != fault;
            if changed {
                c.fault = fault;
                c.changes += 1;
            }
            changed
        });
        if changed {
            tracing::debug!(link = %self.link.name, ?fault, "fault set");
        }
    }

    /// The current fault.
    pub fn fault(&self) -> LinkFault {
        self.control.borrow().fault
    }

    /// Same as `set(LinkFault::Pass)`.
    pub fn heal(&self) {
        self.set(LinkFault::Pass);
    }

    /// Resets (RST) every connection open now, once; the fault is unchanged and later
    /// connections are not affected.
    pub fn reset_connections(&self) {
        self.control.send_modify(|c| c.resets += 1);
        tracing::debug!(link = %self.link.name, "resetting open connections");
    }

    /// Client connections accepted and not yet closed (including those still connecting
    /// upstream).
    pub fn open_connections(&self) -> usize {
        self.link.open.load(Ordering::Relaxed)
    }

    /// Counters since the proxy started.
    pub fn stats(&self) -> LinkStats {
        let c = &self.link.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let (s, k) = (Direction::ToServer as usize, Direction::ToClient as usize);
        LinkStats {
            forwarded_to_server: get(&c.forwarded[s]),
            forwarded_to_client: get(&c.forwarded[k]),
            dropped_to_server: get(&c.dropped[s]),
            dropped_to_client: get(&c.dropped[k]),
            held_to_client: get(&c.held[k]),
            connections_accepted: get(&c.accepted),
            connections_reset: get(&c.reset),
            upstream_failures: get(&c.upstream_failures),
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        // Closes the port now; dropping `control` (right after) ends every task.
        drop(lock(&self.listener).take());
    }
}

impl fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FaultProxy")
            .field("name", &self.link.name)
            .field("addr", &self.addr)
            .field("upstream", &self.link.upstream)
            .field("fault", &self.fault())
            .field("open_connections", &self.open_connections())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

async fn accept_loop(
    listener: ListenerSlot,
    link: Arc<Link>,
    mut control: watch::Receiver<Control>,
) {
    loop {
        let accepted = tokio::select! {
            biased;
            changed = control.changed() => {
                if changed.is_err() {
                    return; // the proxy was dropped
                }
                continue;
            }
            accepted = poll_fn(|cx| poll_accept(&listener, cx)) => accepted,
        };
        match accepted {
            Ok((stream, _peer)) => on_accept(stream, &link, &control),
            Err(_) if lock(&listener).is_none() => return,
            Err(error) => {
                tracing::warn!(link = %link.name, %error, "accept failed, retrying");
                tokio::time::sleep(ACCEPT_BACKOFF).await;
            }
        }
    }
}

fn poll_accept(
    listener: &Mutex<Option<TcpListener>>,
    cx: &mut Context<'_>,
) -> Poll<io::Result<(TcpStream, SocketAddr)>> {
    match lock(listener).as_ref() {
        Some(listener) => listener.poll_accept(cx),
        None => Poll::Ready(Err(io::ErrorKind::NotConnected.into())),
    }
}

fn on_accept(client: TcpStream, link: &Arc<Link>, control: &watch::Receiver<Control>) {
    Counters::add(&link.counters.accepted, 1);
    let ctl = *control.borrow();
    if ctl.fault == LinkFault::Refuse {
        pipe::rst(&client);
        Counters::add(&link.counters.reset, 1);
        tracing::debug!(link = %link.name, "connection refused (reset on accept)");
        return;
    }
    let conn = Conn::new(Arc::clone(link), ctl);
    tokio::spawn(pipe::connect_and_run(client, conn, control.clone()));
}
