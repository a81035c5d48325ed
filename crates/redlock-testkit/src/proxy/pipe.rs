//! One proxied connection: the upstream connect, then one task per direction that reads,
//! applies the link's fault to what it read and writes it out (now, later, or never).
//!
//! A direction keeps a FIFO of chunks, each with the instant it may be written (`None`: held
//! until the fault changes). Reading goes on while earlier chunks wait, so a delay shifts the
//! stream in time without throttling it, and a chunk never overtakes an earlier one, whatever
//! the fault switches to.

use std::collections::VecDeque;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::time::{Instant, Sleep};

use super::{Control, Counters, Link, LinkFault};

/// Size of one read. Redis requests and replies of the tests are far smaller.
const READ_BUF: usize = 16 * 1024;
/// Stop reading a direction while this much is queued for writing (the writer's peer is slow
/// or a long delay is set), so memory stays bounded. Held replies are exempt: the hold buffer
/// is unbounded by contract, and a test holding replies controls how much it sends.
const MAX_QUEUED: usize = 4 * 1024 * 1024;

/// Which way bytes flow; the value indexes the per-direction counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Direction {
    /// Client to server (requests).
    ToServer = 0,
    /// Server to client (replies).
    ToClient = 1,
}

/// What a fault does to a chunk read in one direction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Forward(Duration),
    Hold,
    Drop,
}

fn action(fault: LinkFault, dir: Direction) -> Action {
    use Direction::{ToClient, ToServer};
    match (fault, dir) {
        (LinkFault::Pass, _) => Action::Forward(Duration::ZERO),
        (LinkFault::Latency { to_server, .. }, ToServer) => Action::Forward(to_server),
        (LinkFault::Latency { to_client, .. }, ToClient) => Action::Forward(to_client),
        (LinkFault::HoldReplies | LinkFault::DropReplies, ToServer) => {
            Action::Forward(Duration::ZERO)
        }
        (LinkFault::HoldReplies, ToClient) => Action::Hold,
        (LinkFault::DropReplies, ToClient) | (LinkFault::Blackhole | LinkFault::Refuse, _) => {
            Action::Drop
        }
    }
}

/// RST instead of FIN when the socket is closed.
pub(super) fn rst(stream: &TcpStream) {
    // tokio deprecates set_linger because a *non-zero* linger blocks the thread in close();
    // a zero linger never blocks, it discards unsent data and sends RST, which is the point.
    #[allow(deprecated)]
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// State shared by the two directions of one connection.
#[derive(Debug)]
pub(super) struct Conn {
    link: Arc<Link>,
    /// `Control::resets` when accepted.
    epoch: u64,
    /// The fault when accepted.
    fault: LinkFault,
    /// Its `Control::changes`.
    change: u64,
    /// Some bytes (or an end-of-stream) were dropped, the streams have a hole: 1 + the
    /// `Control::changes` of the fault that dropped them (0: nothing lost). Either direction
    /// resets the connection once the fault has changed since, not before: the other direction
    /// may still be switching to the fault that dropped them.
    lost: AtomicU64,
    /// The reset was counted and logged (once per connection).
    reset: AtomicBool,
    /// Set by the direction that resets, so the other one closes its halves too.
    kill: watch::Sender<bool>,
}

impl Conn {
    /// Counts the connection as open until dropped.
    pub(super) fn new(link: Arc<Link>, ctl: Control) -> Arc<Conn> {
        link.open.fetch_add(1, Ordering::Relaxed);
        Arc::new(Conn {
            link,
            epoch: ctl.resets,
            fault: ctl.fault,
            change: ctl.changes,
            lost: AtomicU64::new(0),
            reset: AtomicBool::new(false),
            kill: watch::channel(false).0,
        })
    }

    fn count_reset(&self, why: &str) {
        if !self.reset.swap(true, Ordering::Relaxed) {
            Counters::add(&self.link.counters.reset, 1);
            tracing::debug!(link = %self.link.name, why, "connection reset");
        }
    }

    fn counters(&self) -> &Counters {
        &self.link.counters
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.link.open.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Connects upstream, then runs both directions until the connection ends.
pub(super) async fn connect_and_run(
    client: TcpStream,
    conn: Arc<Conn>,
    mut control: watch::Receiver<Control>,
) {
    // No timeout: on loopback a connect is answered at once, even by a paused server (its
    // kernel completes the handshake), and the client has its own timeouts.
    let connected = tokio::select! {
        biased;
        () = proxy_dropped(&mut control) => return,
        connected = TcpStream::connect(conn.link.upstream) => connected,
    };
    let server = match connected {
        Ok(server) => server,
        Err(error) => {
            Counters::add(&conn.counters().upstream_failures, 1);
            tracing::debug!(link = %conn.link.name, %error, "upstream unreachable");
            if !sink(&client, &conn, &mut control).await {
                return;
            }
            rst(&client);
            conn.count_reset("the upstream is unreachable");
            return;
        }
    };
    // Small requests and replies must not wait for Nagle's algorithm.
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    let replies = Pipe::new(
        Direction::ToClient,
        server_read,
        client_write,
        Arc::clone(&conn),
        control.clone(),
    );
    tokio::spawn(replies.run());
    Pipe::new(
        Direction::ToServer,
        client_read,
        server_write,
        conn,
        control,
    )
    .run()
    .await;
}

/// Completes when the proxy's control sender is gone.
async fn proxy_dropped(control: &mut watch::Receiver<Control>) {
    while control.changed().await.is_ok() {}
}

/// Under a blackhole, a connection whose upstream is down looks like any other blackholed one:
/// it is kept open and what the client sends is dropped, until the fault changes or
/// connections are reset. Returns at once under any other fault. Returns whether the client
/// connection must now be reset (`false`: the proxy was dropped, close normally).
async fn sink(client: &TcpStream, conn: &Conn, control: &mut watch::Receiver<Control>) -> bool {
    let mut buf = vec![0; READ_BUF];
    loop {
        let ctl = *control.borrow_and_update();
        if ctl.fault != LinkFault::Blackhole || ctl.resets != conn.epoch {
            return true;
        }
        tokio::select! {
            biased;
            changed = control.changed() => if changed.is_err() {
                return false;
            },
            ready = client.readable() => {
                if ready.is_err() {
                    return true;
                }
                match client.try_read(&mut buf) {
                    Ok(0) => return true,
                    Ok(n) => Counters::add(&conn.counters().dropped[Direction::ToServer as usize], n),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(_) => return true,
                }
            }
        }
    }
}

/// Something to write, not before `due` (`None`: held).
struct Chunk {
    due: Option<Instant>,
    item: Item,
}

enum Item {
    Data {
        bytes: Vec<u8>,
        written: usize,
    },
    /// The source ended: shut the destination's write side down.
    Eof,
}

/// Why a direction stopped.
enum End {
    /// End-of-stream was forwarded.
    Finished,
    /// The proxy was dropped: close normally.
    Shutdown,
    /// Reset both sockets of the connection.
    Reset(String),
}

/// One direction of one connection.
struct Pipe {
    dir: Direction,
    conn: Arc<Conn>,
    from: OwnedReadHalf,
    to: OwnedWriteHalf,
    control: watch::Receiver<Control>,
    kill: watch::Receiver<bool>,
    /// The fault the last chunk was handled under.
    applied: LinkFault,
    /// Its `Control::changes`.
    applied_change: u64,
    queue: VecDeque<Chunk>,
    /// Data bytes in `queue` not yet written.
    queued: usize,
    reading: bool,
    buf: Vec<u8>,
    timer: Pin<Box<Sleep>>,
}

impl Pipe {
    fn new(
        dir: Direction,
        from: OwnedReadHalf,
        to: OwnedWriteHalf,
        conn: Arc<Conn>,
        control: watch::Receiver<Control>,
    ) -> Pipe {
        Pipe {
            dir,
            kill: conn.kill.subscribe(),
            applied: conn.fault,
            applied_change: conn.change,
            conn,
            from,
            to,
            control,
            queue: VecDeque::new(),
            queued: 0,
            reading: true,
            buf: vec![0; READ_BUF],
            timer: Box::pin(tokio::time::sleep(Duration::ZERO)),
        }
    }

    async fn run(mut self) {
        match self.forward().await {
            // Dropping the halves sends FIN; for `Finished` it was sent already.
            End::Finished | End::Shutdown => {}
            End::Reset(why) => {
                let _ = self.conn.kill.send_replace(true);
                self.conn.count_reset(&format!("{:?}: {why}", self.dir));
                rst(self.from.as_ref());
                rst(self.to.as_ref());
                // Dropping the write half normally would send FIN before the RST.
                self.to.forget();
            }
        }
    }

    async fn forward(&mut self) -> End {
        loop {
            if let Some(end) = self.apply_control() {
                return end;
            }
            let now = Instant::now();
            let head_due = self.queue.front().and_then(|c| c.due);
            if let Some(Chunk {
                due: Some(due),
                item: Item::Eof,
            }) = self.queue.front()
            {
                if *due <= now {
                    let _ = self.to.shutdown().await;
                    return End::Finished;
                }
            }
            let can_write = head_due.is_some_and(|due| due <= now);
            let wait = head_due.filter(|due| *due > now);
            if let Some(due) = wait {
                if self.timer.deadline() != due || self.timer.is_elapsed() {
                    self.timer.as_mut().reset(due);
                }
            }
            let holding = action(self.applied, self.dir) == Action::Hold;
            let can_read = self.reading && (self.queued < MAX_QUEUED || holding);
            tokio::select! {
                biased;
                _ = self.kill.changed() => {
                    return End::Reset("the other direction reset the connection".to_owned());
                }
                changed = self.control.changed() => if changed.is_err() {
                    return End::Shutdown;
                },
                written = write_head(&mut self.to, &self.queue), if can_write => match written {
                    Ok(0) => return End::Reset("the peer stopped accepting bytes".to_owned()),
                    Ok(n) => self.advance(n),
                    Err(e) => return End::Reset(format!("write failed: {e}")),
                },
                () = &mut self.timer, if wait.is_some() => {}
                read = self.from.read(&mut self.buf), if can_read => {
                    if let Some(end) = self.on_read(read) {
                        return end;
                    }
                }
            }
        }
    }

    /// Picks up a new fault or reset request; returns how to end, if it is time.
    fn apply_control(&mut self) -> Option<End> {
        if *self.kill.borrow() {
            return Some(End::Reset(
                "the other direction reset the connection".to_owned(),
            ));
        }
        let ctl = *self.control.borrow_and_update();
        if ctl.resets != self.conn.epoch {
            return Some(End::Reset("reset_connections() was called".to_owned()));
        }
        if ctl.changes != self.applied_change {
            let lost = self.conn.lost.load(Ordering::Relaxed);
            if lost != 0 && lost - 1 != ctl.changes {
                return Some(End::Reset(format!(
                    "bytes were lost under an earlier fault, now {:?}",
                    ctl.fault
                )));
            }
            // Held replies are delivered before the new fault applies to anything read later.
            let now = Instant::now();
            for chunk in &mut self.queue {
                chunk.due.get_or_insert(now);
            }
            self.applied = ctl.fault;
            self.applied_change = ctl.changes;
        }
        (self.applied == LinkFault::Refuse).then(|| End::Reset("fault Refuse".to_owned()))
    }

    /// Marks the connection as having lost bytes under the applied fault.
    fn lose(&self) {
        let _ = self.conn.lost.compare_exchange(
            0,
            self.applied_change + 1,
            Ordering::Relaxed,
            Ordering::Relaxed,
        );
    }

    fn on_read(&mut self, read: io::Result<usize>) -> Option<End> {
        let act = action(self.applied, self.dir);
        let now = Instant::now();
        let dir = self.dir as usize;
        match read {
            Ok(0) => {
                self.reading = false;
                match act {
                    // A latency too long to represent holds the data, as `Hold` does.
                    Action::Forward(delay) => self.push(now.checked_add(delay), Item::Eof),
                    Action::Hold => self.push(None, Item::Eof),
                    Action::Drop => self.lose(),
                }
            }
            Ok(n) => match act {
                Action::Drop => {
                    Counters::add(&self.conn.counters().dropped[dir], n);
                    self.lose();
                }
                Action::Hold => {
                    Counters::add(&self.conn.counters().held[dir], n);
                    let bytes = self.buf[..n].to_vec();
                    self.push_data(None, bytes);
                }
                Action::Forward(delay) => {
                    let mut start = 0;
                    // Fast path for Pass: write straight from the read buffer.
                    if delay.is_zero() && self.queue.is_empty() {
                        match self.to.try_write(&self.buf[..n]) {
                            Ok(w) => {
                                start = w;
                                Counters::add(&self.conn.counters().forwarded[dir], w);
                            }
                            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                            Err(e) => return Some(End::Reset(format!("write failed: {e}"))),
                        }
                    }
                    if start < n {
                        let bytes = self.buf[start..n].to_vec();
                        self.push_data(now.checked_add(delay), bytes);
                    }
                }
            },
            Err(e) => {
                if act != Action::Drop {
                    return Some(End::Reset(format!("read failed: {e}")));
                }
                self.reading = false;
                self.lose();
            }
        }
        None
    }

    fn push_data(&mut self, due: Option<Instant>, bytes: Vec<u8>) {
        self.queued += bytes.len();
        self.push(due, Item::Data { bytes, written: 0 });
    }

    fn push(&mut self, due: Option<Instant>, item: Item) {
        self.queue.push_back(Chunk { due, item });
    }

    /// `n` bytes of the head chunk were written.
    fn advance(&mut self, n: usize) {
        Counters::add(&self.conn.counters().forwarded[self.dir as usize], n);
        self.queued -= n;
        if let Some(Chunk {
            item: Item::Data { bytes, written },
            ..
        }) = self.queue.front_mut()
        {
            *written += n;
            if *written == bytes.len() {
                self.queue.pop_front();
            }
        }
    }
}

/// Writes (part of) the head chunk; never completes if the head is not data. Cancel-safe: a
/// write that did not complete wrote nothing.
async fn write_head(to: &mut OwnedWriteHalf, queue: &VecDeque<Chunk>) -> io::Result<usize> {
    match queue.front() {
        Some(Chunk {
            item: Item::Data { bytes, written },
            ..
        }) => to.write(&bytes[*written..]).await,
        _ => std::future::pending().await,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_map_to_actions_per_direction() {
        use Direction::{ToClient, ToServer};
        let ms = Duration::from_millis;
        let latency = LinkFault::Latency {
            to_server: ms(5),
            to_client: ms(7),
        };
        let cases = [
            (
                LinkFault::Pass,
                Action::Forward(ms(0)),
                Action::Forward(ms(0)),
            ),
            (latency, Action::Forward(ms(5)), Action::Forward(ms(7))),
            (LinkFault::Blackhole, Action::Drop, Action::Drop),
            (LinkFault::HoldReplies, Action::Forward(ms(0)), Action::Hold),
            (LinkFault::DropReplies, Action::Forward(ms(0)), Action::Drop),
            (LinkFault::Refuse, Action::Drop, Action::Drop),
        ];
        for (fault, requests, replies) in cases {
            assert_eq!(action(fault, ToServer), requests, "{fault:?} requests");
            assert_eq!(action(fault, ToClient), replies, "{fault:?} replies");
        }
    }
}
