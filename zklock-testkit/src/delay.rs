//! Network distance on loopback: a TCP relay that delays every byte by half a round trip each
//! way, for benchmarks that must not pretend client and server share a machine.
//!
//! On loopback a round trip takes some 50 µs; between machines of one data centre it takes
//! 0.2–1 ms, and a lock that makes three round trips per acquire where another makes one is
//! then three times slower, which loopback hides. The kernel's `netem` would add the distance,
//! but it needs privileges this machine does not give, so [`Delay`] adds it in user space.
//!
//! Each direction of each connection has a reader thread and a writer thread. The reader
//! stamps every chunk it reads with its due time (`now + rtt / 2`) and queues it; the writer
//! sleeps until the chunk at the head of its queue is due and writes it. The delay is counted
//! from the moment a chunk is read, never from the moment the writer got to it, so bytes sent
//! back to back (a pipeline) arrive back to back, one delay later: they do not queue behind
//! each other's delays. Order is kept and nothing is lost or merged.
//!
//! tokio's timer wheel ticks in whole milliseconds, far too coarse for a 0.5 ms delay, so the
//! writers are plain threads that sleep with `nanosleep` (with the thread's timer slack cut to
//! 1 ns on Linux, so the kernel does not round the wake-up by its default 50 µs), end each
//! sleep early by as much as their sleeps overshoot, and yield the last few µs away (see
//! `Clock`). Threads are cheap at this scale: a benchmark's 200 connections make 800 small ones.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::thread;
use std::time::{Duration, Instant};

use crate::fault_switch;

/// A chunk written this much after its due time counts as late ([`DelayStats::late`]).
const LATE: Duration = Duration::from_micros(200);
/// Each pump thread's stack: a loop around one read or one write needs little.
const STACK: usize = 128 * 1024;
/// The most one read takes from a socket.
const CHUNK: usize = 64 * 1024;

/// What a [`Delay`] has carried so far; see [`Delay::stats`].
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
///
/// let redis = zklock_testkit::RedisServer::start()?;
/// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", redis.port()), Duration::from_millis(1))?;
/// // ... clients connect to delay.url(&redis.url()) and work ...
/// let stats = delay.stats();
/// println!("{} round trips over {} connections", stats.round_trips, stats.connections);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DelayStats {
    /// Client connections accepted (and connected upstream).
    pub connections: u64,
    /// Round trips: on each connection, every chunk from the client that follows the delivery
    /// of a chunk from the server (or is the connection's first chunk from the client) starts
    /// one. A client that waits for each answer before it asks again makes one per request; a
    /// pipeline of requests sent before the first answer arrives makes one.
    pub round_trips: u64,
    /// Chunks read from clients (each `read()` that returned data).
    pub requests: u64,
    /// Chunks read from the server.
    pub replies: u64,
    /// Chunks written more than 0.2 ms after their due time: the machine (or the relay) was
    /// too busy to keep the distance exact. A few are noise; many mean the figures measured
    /// through the relay include the relay's own queueing.
    pub late: u64,
}

/// A TCP relay in front of one server that puts `rtt` of network distance between the server
/// and every client that connects through it: each direction of each connection is delayed by
/// `rtt / 2`, so a request and its answer take one `rtt` more than on loopback.
///
/// Point clients at [`addr`](Self::addr) (or a URL rewritten by [`url`](Self::url)) instead
/// of the server. The relay does not parse what it carries, so it serves any protocol: Redis,
/// PostgreSQL, MySQL, etcd's gRPC, ZooKeeper, TLS. Bytes keep their order and are delivered
/// whole; bytes sent back to back arrive back to back (the delay is not paid once per chunk
/// in a queue). It also counts the round trips it carries ([`round_trips`](Self::round_trips)),
/// so a benchmark can show how many each cycle of a lock took, measured on the wire.
///
/// Unlike [`Relay`](crate::Relay) it injects no fault: its job is precision, at up to a few
/// hundred connections. The TCP handshake is not delayed (a connection is accepted at once),
/// so connecting costs no round trip; everything after it does. Dropping the relay closes every
/// connection through it.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use zklock_testkit::{Delay, PostgresServer};
///
/// let pg = PostgresServer::start()?;
/// let delay = Delay::start(&format!("127.0.0.1:{}", pg.port()), Duration::from_millis(1))?;
/// let url = delay.url(&pg.url()); // a client on this URL is 1 ms away from the server
/// # let _ = url;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Delay {
    shared: Arc<Shared>,
    addr: SocketAddr,
}

/// What the relay's threads share.
struct Shared {
    upstream: SocketAddr,
    /// Half the round trip: each direction's delay.
    half: Duration,
    /// Set on drop: the acceptor stops.
    closed: AtomicBool,
    counters: Counters,
    /// The connections open now, to close on drop.
    open: Mutex<HashMap<u64, Weak<Conn>>>,
    next_id: AtomicU64,
}

#[derive(Default)]
struct Counters {
    connections: AtomicU64,
    round_trips: AtomicU64,
    requests: AtomicU64,
    replies: AtomicU64,
    late: AtomicU64,
}

impl fmt::Debug for Delay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Delay")
            .field("listen", &self.addr)
            .field("upstream", &self.shared.upstream)
            .field("rtt", &self.rtt())
            .finish()
    }
}

impl Delay {
    /// Starts a relay to `upstream` (`"host:port"`) on a free loopback port, adding `rtt` to
    /// every round trip through it (half each way).
    ///
    /// # Errors
    ///
    /// When `upstream` does not resolve, no loopback port can be bound, or the machine refuses
    /// another thread.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", redis.port()), Duration::from_micros(500))?;
    /// assert_ne!(delay.port(), redis.port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(upstream: &str, rtt: Duration) -> io::Result<Delay> {
        let upstream = upstream.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("the delay's upstream {upstream} has no address"),
            )
        })?;
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            upstream,
            half: rtt / 2,
            closed: AtomicBool::new(false),
            counters: Counters::default(),
            open: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(0),
        });
        let acceptor = shared.clone();
        thread::Builder::new()
            .name("zklock-delay-accept".into())
            .spawn(move || accept_loop(&listener, &acceptor))?;
        Ok(Delay { shared, addr })
    }

    /// The relay's address (`127.0.0.1:PORT`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redis = zklock_testkit::RedisServer::start()?;
    /// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", redis.port()), std::time::Duration::from_millis(1))?;
    /// assert!(delay.addr().ip().is_loopback());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The relay's port.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redis = zklock_testkit::RedisServer::start()?;
    /// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", redis.port()), std::time::Duration::from_millis(1))?;
    /// assert_eq!(delay.port(), delay.addr().port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The address traffic is forwarded to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redis = zklock_testkit::RedisServer::start()?;
    /// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", redis.port()), std::time::Duration::from_millis(1))?;
    /// assert_eq!(delay.upstream().port(), redis.port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream
    }

    /// The round trip the relay adds (twice each direction's delay).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// # let redis = zklock_testkit::RedisServer::start()?;
    /// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", redis.port()), Duration::from_millis(2))?;
    /// assert_eq!(delay.rtt(), Duration::from_millis(2));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn rtt(&self) -> Duration {
        self.shared.half * 2
    }

    /// `url` (a server's URL, e.g. [`RedisServer::url`](crate::RedisServer::url), or a
    /// ZooKeeper connect string) with the upstream's `host:port` replaced by the relay's: the
    /// same server, at a distance.
    ///
    /// # Panics
    ///
    /// When `url` does not name the upstream's `127.0.0.1:PORT` or `localhost:PORT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", pg.port()), std::time::Duration::from_millis(1))?;
    /// let url = delay.url(&pg.url());
    /// assert!(url.contains(&format!("127.0.0.1:{}", delay.port())));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self, url: &str) -> String {
        fault_switch::reroute(url, self.shared.upstream, self.addr)
    }

    /// What the relay has carried so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redis = zklock_testkit::RedisServer::start()?;
    /// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", redis.port()), std::time::Duration::from_millis(1))?;
    /// assert_eq!(delay.stats().connections, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stats(&self) -> DelayStats {
        let c = &self.shared.counters;
        DelayStats {
            connections: c.connections.load(Ordering::SeqCst),
            round_trips: c.round_trips.load(Ordering::SeqCst),
            requests: c.requests.load(Ordering::SeqCst),
            replies: c.replies.load(Ordering::SeqCst),
            late: c.late.load(Ordering::SeqCst),
        }
    }

    /// The round trips carried so far, over every connection (see
    /// [`DelayStats::round_trips`]): read it before and after a run and divide by the run's
    /// cycles for the round trips per cycle.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let redis = zklock_testkit::RedisServer::start()?;
    /// let delay = zklock_testkit::Delay::start(&format!("127.0.0.1:{}", redis.port()), std::time::Duration::from_millis(1))?;
    /// let before = delay.round_trips();
    /// // ... 100 cycles of a client through delay.url(&redis.url()) ...
    /// let per_cycle = (delay.round_trips() - before) as f64 / 100.0;
    /// # let _ = per_cycle;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn round_trips(&self) -> u64 {
        self.shared.counters.round_trips.load(Ordering::SeqCst)
    }
}

impl Drop for Delay {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        let open: Vec<Weak<Conn>> = self.shared.lock_open().drain().map(|(_, c)| c).collect();
        for conn in open.iter().filter_map(Weak::upgrade) {
            conn.close();
        }
        // Wakes the acceptor, which then sees `closed` and ends.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
    }
}

impl Shared {
    fn lock_open(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Weak<Conn>>> {
        self.open.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Accepts clients until the relay is dropped, each connected upstream and pumped both ways.
fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for client in listener.incoming() {
        if shared.closed.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else {
            // EMFILE and the like: try again shortly.
            thread::sleep(Duration::from_millis(10));
            continue;
        };
        // A server that is down: the client sees its connection closed, as without a relay.
        let Ok(server) = TcpStream::connect(shared.upstream) else {
            continue;
        };
        if let Err(e) = Conn::start(shared, client, server) {
            eprintln!("zklock-testkit delay: cannot serve a connection: {e}");
        }
    }
}

/// One client's connection through the relay: both sides, and which spoke last.
struct Conn {
    id: u64,
    shared: Arc<Shared>,
    client: TcpStream,
    server: TcpStream,
    /// Whether a chunk from the server was delivered to the client since the client's last
    /// chunk: the client's next one then starts a round trip (it may answer it). True at first,
    /// so the client's first chunk does too.
    server_spoke_last: AtomicBool,
}

/// Which way a pump carries bytes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    /// Client to server.
    Up,
    /// Server to client.
    Down,
}

impl Conn {
    /// Registers the connection and starts its four pumps.
    fn start(shared: &Arc<Shared>, client: TcpStream, server: TcpStream) -> io::Result<()> {
        client.set_nodelay(true)?;
        server.set_nodelay(true)?;
        let conn = Arc::new(Conn {
            id: shared.next_id.fetch_add(1, Ordering::SeqCst),
            shared: shared.clone(),
            client,
            server,
            server_spoke_last: AtomicBool::new(true),
        });
        shared.lock_open().insert(conn.id, Arc::downgrade(&conn));
        shared.counters.connections.fetch_add(1, Ordering::SeqCst);
        let started = [Way::Up, Way::Down].into_iter().try_for_each(|way| {
            let (tx, rx) = mpsc::channel();
            let (reader, writer) = (conn.clone(), conn.clone());
            spawn("zklock-delay-read", move || reader.read_side(way, &tx))?;
            spawn("zklock-delay-write", move || writer.write_side(way, &rx))
        });
        if started.is_err() {
            // The pumps that did start end with it.
            conn.close();
        }
        started
    }

    /// The socket a way reads from and the one it writes to.
    fn ends(&self, way: Way) -> (&TcpStream, &TcpStream) {
        match way {
            Way::Up => (&self.client, &self.server),
            Way::Down => (&self.server, &self.client),
        }
    }

    /// Reads chunks from `way`'s source and queues each, stamped with its due time, until the
    /// source closes (the queue's end then tells the writer) or fails (everything closes).
    fn read_side(&self, way: Way, queue: &Sender<(Instant, Vec<u8>)>) {
        let (mut from, _) = self.ends(way);
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => return,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return self.close(),
            };
            let due = Instant::now() + self.shared.half;
            self.count(way);
            if queue.send((due, buf[..n].to_vec())).is_err() {
                return;
            }
        }
    }

    /// Counts a chunk read on `way`, and the round trip a client's chunk starts.
    fn count(&self, way: Way) {
        let c = &self.shared.counters;
        match way {
            Way::Up => {
                c.requests.fetch_add(1, Ordering::SeqCst);
                if self.server_spoke_last.swap(false, Ordering::SeqCst) {
                    c.round_trips.fetch_add(1, Ordering::SeqCst);
                }
            }
            Way::Down => {
                c.replies.fetch_add(1, Ordering::SeqCst);
            }
        }
    }

    /// Writes each queued chunk to `way`'s destination once it is due; when the reader is done,
    /// passes the close on (a half-close: the other way goes on).
    fn write_side(&self, way: Way, queue: &Receiver<(Instant, Vec<u8>)>) {
        let mut clock = Clock::new();
        let (_, mut to) = self.ends(way);
        while let Ok((due, bytes)) = queue.recv() {
            clock.wait_until(due);
            if Instant::now() > due + LATE {
                self.shared.counters.late.fetch_add(1, Ordering::SeqCst);
            }
            if way == Way::Down {
                // Before the write: the client cannot answer what it has not been given.
                self.server_spoke_last.store(true, Ordering::SeqCst);
            }
            if to.write_all(&bytes).is_err() {
                return self.close();
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    }

    /// Closes both sides both ways: every pump of the connection ends.
    fn close(&self) {
        let _ = self.client.shutdown(Shutdown::Both);
        let _ = self.server.shutdown(Shutdown::Both);
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.shared.lock_open().remove(&self.id);
    }
}

/// Starts a pump thread named `name`.
fn spawn(name: &str, pump: impl FnOnce() + Send + 'static) -> io::Result<()> {
    thread::Builder::new()
        .name(name.into())
        .stack_size(STACK)
        .spawn(pump)
        .map(drop)
}

/// A writer's way of waiting until a chunk is due. A sleep ends late, by a few µs on idle
/// hardware and by 50–100 µs (growing with the sleep) on a virtual machine whose CPU idles in
/// between: a fifth of a 0.5 ms delay. So the clock learns how late this thread's sleeps end,
/// sleeps that much less, and yields the processor the rest of the way.
struct Clock {
    /// How much earlier than due to end a sleep: the mean overshoot seen so far.
    early: Duration,
}

/// The most a sleep is cut short by: beyond it, the machine is too busy for precision anyway.
const MAX_EARLY: Duration = Duration::from_micros(300);

impl Clock {
    /// A clock on the calling thread, whose timer slack it cuts to the least.
    fn new() -> Clock {
        precise_timers();
        Clock {
            early: Duration::from_micros(50),
        }
    }

    /// Returns at `due` (at once if it has passed).
    fn wait_until(&mut self, due: Instant) {
        let now = Instant::now();
        if due <= now {
            return;
        }
        let wake = due.checked_sub(self.early).unwrap_or(due);
        if wake > now {
            thread::sleep(wake - now);
            let over = Instant::now().saturating_duration_since(wake);
            // A running mean over the last eight or so sleeps.
            self.early = (self.early * 7 + over.min(MAX_EARLY)) / 8;
        }
        while Instant::now() < due {
            thread::yield_now();
        }
    }
}

/// Asks the kernel to wake this thread's sleeps on time: Linux rounds them by the thread's
/// timer slack, 50 µs by default, a tenth of a 0.5 ms delay.
fn precise_timers() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes a plain integer and changes only this thread's slack.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1 as libc::c_ulong, 0, 0, 0);
    }
}
