//! A plain fault-injecting TCP relay: the protocol-blind counterpart of [`Proxy`](crate::Proxy)
//! for Redis and PostgreSQL.
//!
//! The relay does not parse what it carries. It works on *turns*: every chunk of bytes one
//! `read()` gets from a client is a request (PostgreSQL and Redis clients write a whole
//! pipeline of messages at once, so one chunk is usually one round trip), and what the server
//! sends back is a reply. That is enough to let the server receive the n-th request and cut
//! the client off before it hears the answer, at every request boundary of a protocol in turn.

use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

use crate::fault_switch::{self, wait_open, write_due, Due, End, FaultSwitch, Link};
use crate::listening::Listening;

/// How long a cut waits for the first reply after its request reached the server before it
/// fires anyway (a request the server does not answer, such as a close).
const REPLY_GRACE: Duration = Duration::from_millis(500);
/// After the first withheld reply, how long the relay keeps swallowing the server's bytes before
/// it resets the connection: the server has then read the request (a reset can make the
/// server's kernel discard a request its process has not read yet).
const SETTLE: Duration = Duration::from_millis(30);

/// The runtime every relay of the process runs on: one worker thread, alive as long as the process.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    fault_switch::runtime(&RUNTIME, "zklock-testkit-relay")
}

/// What the relay does once the server received the request a cut was set for (see
/// [`Relay::cut_after_nth_request`]).
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::{After, Relay};
/// # let pg = zklock_testkit::PostgresServer::start()?;
/// let relay = Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
/// relay.cut_after_nth_request(3, After::ResetAndBlackhole);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum After {
    /// Withhold the reply and reset that connection (both ways); the client reconnects at once.
    Reset,
    /// Withhold the reply, reset that connection, and [`blackhole`](Relay::blackhole) the relay
    /// until [`heal`](Relay::heal): the network went down right after the server acted.
    ResetAndBlackhole,
    /// [`Blackhole`](Relay::blackhole) the relay from the reply on, resetting nothing: a
    /// partition (or a host that died) right after the server acted. Neither side hears of it;
    /// the server ends the session only by a timeout of its own. [`heal`](Relay::heal)
    /// delivers the reply, as TCP would once the partition ends.
    Blackhole,
}

/// The armed cut: fires on the `remaining`-th next request.
#[derive(Debug)]
struct CutRule {
    remaining: u64,
    after: After,
}

/// What the relay counts beyond the switch's connections and resets.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    replies: AtomicU64,
    cuts: AtomicU64,
    held_back: AtomicU64,
}

/// What the relay's connections share: the fault switch, and the group it counts and cuts with.
struct Shared {
    switch: FaultSwitch,
    group: Arc<Group>,
    /// Connections whose first request contains this are not counted (see
    /// [`Relay::uncounted_when_first_request_has`]).
    uncounted: Mutex<Option<Vec<u8>>>,
    /// Requests that contain a marker are held back its delay (see
    /// [`Relay::hold_back_requests_with`]).
    held_back: Mutex<Vec<(Vec<u8>, Duration)>>,
}

impl Shared {
    /// How long the request `chunk` is held back before it is forwarded, beyond the switch's
    /// delay; counted.
    fn held_back(&self, chunk: &[u8]) -> Duration {
        let rules = self.held_back.lock().unwrap_or_else(|e| e.into_inner());
        let delay = rules
            .iter()
            .filter(|(marker, _)| contains(chunk, marker))
            .map(|(_, delay)| *delay)
            .max();
        if delay.is_some() {
            self.group.counters.held_back.fetch_add(1, Ordering::SeqCst);
        }
        delay.unwrap_or_default()
    }

    /// Whether a connection whose first request is `first` goes uncounted.
    fn uncounted(&self, first: &[u8]) -> bool {
        let marker = self.uncounted.lock().unwrap_or_else(|e| e.into_inner());
        marker.as_deref().is_some_and(|m| contains(first, m))
    }
}

/// Whether `marker` occurs in `bytes`.
fn contains(bytes: &[u8], marker: &[u8]) -> bool {
    bytes.windows(marker.len().max(1)).any(|w| w == marker)
}

/// What relays started beside each other share (see [`Relay::start_beside`]; a relay started
/// alone is a group of one): the cut to make, the counts, and every member, whose partitions a
/// cut begins together.
#[derive(Default)]
struct Group {
    cut: Mutex<Option<CutRule>>,
    counters: Counters,
    members: Mutex<Vec<Weak<Shared>>>,
}

impl Group {
    /// Partitions every member (a cut's `ResetAndBlackhole` and `Blackhole`: the client is cut
    /// off from every server it reaches through the group).
    fn blackhole(&self) {
        let members = self.members.lock().unwrap_or_else(|e| e.into_inner());
        for member in members.iter().filter_map(Weak::upgrade) {
            member.switch.blackhole();
        }
    }
}

impl AsRef<FaultSwitch> for Shared {
    fn as_ref(&self) -> &FaultSwitch {
        &self.switch
    }
}

/// What the relay has seen so far; see [`Relay::stats`].
///
/// # Examples
///
/// ```no_run
/// # let pg = zklock_testkit::PostgresServer::start()?;
/// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
/// // ... a client connects to relay.url(&pg.url()) ...
/// let stats = relay.stats();
/// println!("{} connections, {} requests", stats.connections, stats.requests);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Requests: chunks of bytes read from clients (each `read()` that returned data).
    pub requests: u64,
    /// Chunks of bytes read from the server and forwarded to clients.
    pub replies: u64,
    /// Cuts that fired ([`Relay::cut_after_nth_request`]).
    pub cuts: u64,
    /// Connections reset by the relay ([`Relay::reset`], [`Relay::refuse`], a cut, its drop).
    pub resets: u64,
}

/// A fault-injecting TCP relay in front of one server of any protocol (Redis, PostgreSQL):
/// point a client at [`addr`](Self::addr) (or a URL rewritten by [`url`](Self::url)) instead of
/// the server, then cut it off ([`blackhole`](Self::blackhole)), reset its connections
/// ([`reset`](Self::reset)), refuse new ones ([`refuse`](Self::refuse)), slow it down
/// ([`set_delay`](Self::set_delay)), or let the server act on its n-th request and cut the
/// client off before the answer ([`cut_after_nth_request`](Self::cut_after_nth_request)).
///
/// A *request* is a chunk of bytes one `read()` gets from a client, counted over every
/// connection in the order they reach the relay ([`requests`](Self::requests)). Clients such as
/// `tokio-postgres` and `redis` write each round trip's messages at once, so on loopback a
/// request is one round trip; a sweep counts a protocol's requests on an uncut run and then
/// cuts after each k in turn. Background traffic (liveness checks) counts too: keep the run
/// shorter than its period, or expect a boundary to move by one now and then.
///
/// The relay listens on a free loopback port (kept for its whole life, so clients reconnect to
/// the same address) and runs on a small runtime of its own, so it serves blocking and async
/// tests alike. Dropping it resets every connection through it.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use zklock_testkit::{After, PostgresServer, Relay};
///
/// let pg = PostgresServer::start()?;
/// let relay = Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
/// let url = relay.url(&pg.url()); // give this to the client under test
/// relay.blackhole(); // a partition
/// relay.heal();
/// relay.set_delay(Duration::from_millis(20));
/// relay.cut_after_nth_request(2, After::Reset); // the 2nd request is served, its answer lost
/// # let _ = url;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Relay {
    shared: Listening<Shared>,
}

impl fmt::Debug for Relay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.debug("Relay", f)
    }
}

impl Relay {
    /// Starts a relay to `upstream` (`"host:port"`) on a free loopback port. It forwards
    /// everything until told otherwise.
    ///
    /// # Errors
    ///
    /// When `upstream` does not resolve or no loopback port can be bound.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", redis.port()))?;
    /// assert_ne!(relay.port(), redis.port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(upstream: &str) -> io::Result<Relay> {
        Relay::start_in(upstream, Arc::default())
    }

    /// Starts another relay, to `upstream`, that counts and cuts together with this one: one
    /// client's way to several servers (the nodes of a Redis Cluster, each announcing a relay's
    /// address). [`requests`](Self::requests) and [`stats`](Self::stats)' requests, replies and
    /// cuts count over every relay of the group; a cut set on any of them fires on the n-th
    /// request over all of them, and its partition (`After::ResetAndBlackhole`,
    /// `After::Blackhole`) holds on every one of them, each until its own
    /// [`heal`](Self::heal). Other faults ([`blackhole`](Self::blackhole),
    /// [`reset`](Self::reset), [`refuse`](Self::refuse), [`set_delay`](Self::set_delay)) stay
    /// each relay's own.
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{After, Relay, RedisCluster};
    ///
    /// let cluster = RedisCluster::start()?;
    /// let first = Relay::start(&cluster.addr(0))?;
    /// let second = first.start_beside(&cluster.addr(1))?;
    /// // The client's 3rd request, to either node, is served and its answer lost.
    /// first.cut_after_nth_request(3, After::ResetAndBlackhole);
    /// // ... the client runs; then both relays are cut off: heal each ...
    /// first.heal();
    /// second.heal();
    /// assert_eq!(first.requests(), second.requests());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start_beside(&self, upstream: &str) -> io::Result<Relay> {
        Relay::start_in(upstream, self.shared.group.clone())
    }

    /// Starts a relay to `upstream` in `group`.
    fn start_in(upstream: &str, group: Arc<Group>) -> io::Result<Relay> {
        let shared = Listening::start(
            upstream,
            runtime(),
            |switch| Shared {
                switch,
                group: group.clone(),
                uncounted: Mutex::new(None),
                held_back: Mutex::new(Vec::new()),
            },
            serve,
        )?;
        group
            .members
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(Arc::downgrade(shared.arc()));
        Ok(Relay { shared })
    }

    /// The relay's address (`127.0.0.1:PORT`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// assert!(relay.addr().ip().is_loopback());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn addr(&self) -> SocketAddr {
        self.shared.addr()
    }

    /// The relay's port.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// assert_ne!(relay.port(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn port(&self) -> u16 {
        self.shared.addr().port()
    }

    /// The address traffic is forwarded to.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// assert_eq!(relay.upstream().port(), pg.port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream()
    }

    /// `url` (a server's URL, e.g. [`PostgresServer::url`](crate::PostgresServer::url) or
    /// [`RedisServer::url`](crate::RedisServer::url)) with the upstream's `host:port` replaced
    /// by the relay's: the same server, reached through the relay.
    ///
    /// # Panics
    ///
    /// When `url` does not name the upstream's `127.0.0.1:PORT` or `localhost:PORT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// let url = relay.url(&pg.url());
    /// assert!(url.contains(&format!("127.0.0.1:{}", relay.port())));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self, url: &str) -> String {
        fault_switch::reroute(url, self.upstream(), self.addr())
    }

    fault_switch::switch_controls!(
        "# let pg = zklock_testkit::PostgresServer::start()?;\nlet relay = zklock_testkit::Relay::start(&format!(\"127.0.0.1:{}\", pg.port()))?;",
        "relay"
    );

    /// The adversary's cut: the `n`-th request from now on (1 = the next one; requests are
    /// counted as [`requests`](Self::requests) counts them, over every connection) is delivered
    /// to the server, and everything the server sends back on that connection from then on is
    /// withheld; then `after` says what happens to the client ([`After`]).
    ///
    /// The cut fires on the first reply bytes on that connection after the request was written
    /// to the server, or half a second after it if none come (a request with no answer). With
    /// a reset, the relay swallows the server's bytes a moment longer before it resets, so the
    /// server has read the request. Replaces a cut that has not fired yet;
    /// [`stats`](Self::stats) counts the cuts that fired.
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{After, Relay};
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// relay.cut_after_nth_request(1, After::Reset);
    /// assert!(relay.cut_pending());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn cut_after_nth_request(&self, n: u64, after: After) {
        assert!(n > 0, "requests are counted from 1");
        *self
            .shared
            .group
            .cut
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(CutRule {
            remaining: n,
            after,
        });
    }

    /// Leaves out of the count every connection opened from now on whose first request contains
    /// `marker`: its requests are neither counted nor cut (a partition or a reset still holds
    /// for it). For a third party that reaches the server through the same address as the
    /// client under test: a Redis Sentinel monitoring a primary through the relay names its
    /// connections first (`CLIENT SETNAME sentinel-<id>-cmd`), and so sweeps count only the
    /// client's own requests.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let redis = zklock_testkit::RedisServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", redis.port()))?;
    /// relay.uncounted_when_first_request_has(b"sentinel-");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn uncounted_when_first_request_has(&self, marker: &[u8]) {
        *self
            .shared
            .uncounted
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(marker.to_vec());
    }

    /// Holds back every request that contains `marker` for `delay` before forwarding it (and,
    /// bytes kept in order, what that connection sends after it): a statement that arrives
    /// late, as a cancel or a kill sent from a sibling connection may, which the server then
    /// runs after the client went on. Each call adds a rule; a request that matches several is
    /// held back the longest. [`held_back`](Self::held_back) counts them.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use std::time::Duration;
    ///
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", db.port()))?;
    /// // A MySQL client's `KILL <id>` reaches the server 2 s after it was sent.
    /// relay.hold_back_requests_with(b"KILL ", Duration::from_secs(2));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn hold_back_requests_with(&self, marker: &[u8], delay: Duration) {
        self.shared
            .held_back
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((marker.to_vec(), delay));
    }

    /// How many requests were held back (see
    /// [`hold_back_requests_with`](Self::hold_back_requests_with)).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let db = zklock_testkit::MariaDbServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", db.port()))?;
    /// assert_eq!(relay.held_back(), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn held_back(&self) -> u64 {
        self.shared.group.counters.held_back.load(Ordering::SeqCst)
    }

    /// Whether a cut is armed and its request has not come yet.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// assert!(!relay.cut_pending());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn cut_pending(&self) -> bool {
        self.shared
            .group
            .cut
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// How many requests (chunks of bytes read from clients) have reached the relay so far,
    /// over every connection. They are counted as they arrive, before any delay; a blackhole
    /// leaves them unread, so uncounted, until it ends.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// let before = relay.requests();
    /// // ... run the protocol once, uncut ...
    /// let sent = relay.requests() - before; // cut after each of 1..=sent in turn
    /// # let _ = sent;
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn requests(&self) -> u64 {
        self.shared.group.counters.requests.load(Ordering::SeqCst)
    }

    /// What the relay has seen and done so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::Relay::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// assert_eq!(relay.stats().connections, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stats(&self) -> RelayStats {
        let c = &self.shared.group.counters;
        RelayStats {
            connections: self.shared.switch.connections(),
            requests: c.requests.load(Ordering::SeqCst),
            replies: c.replies.load(Ordering::SeqCst),
            cuts: c.cuts.load(Ordering::SeqCst),
            resets: self.shared.switch.resets(),
        }
    }
}

/// One client's connection: to the server, with a pump each way.
async fn serve(client: TcpStream, shared: Arc<Shared>) {
    let Some(mut link) = Link::open(&shared.switch, client).await else {
        return;
    };
    // Set once this connection's request that a cut was set for was written to the server:
    // what to do, and when it was written.
    let armed = watch::Sender::new(None::<(After, Instant)>);
    let generation = link.generation;
    let end = {
        let h = link.split();
        let up = upstream_pump(h.client_read, h.server_write, &shared, &armed, generation);
        let down = downstream_pump(h.server_read, h.client_write, &shared, &armed, generation);
        fault_switch::race(&shared.switch, generation, up, down).await
    };
    link.end(&shared.switch, end);
}

/// Whether the chunk just read is the request a cut waits for; counts it either way.
fn count_request(shared: &Shared) -> Option<After> {
    shared
        .group
        .counters
        .requests
        .fetch_add(1, Ordering::SeqCst);
    let mut rule = shared.group.cut.lock().unwrap_or_else(|e| e.into_inner());
    let r = rule.as_mut()?;
    r.remaining -= 1;
    if r.remaining > 0 {
        return None;
    }
    let after = r.after;
    *rule = None;
    Some(after)
}

/// Client to server: counts requests, arms this connection's cut once its request was written.
async fn upstream_pump<R, W>(
    mut from: R,
    to: W,
    shared: &Shared,
    armed: &watch::Sender<Option<(After, Instant)>>,
    generation: u64,
) -> End
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (tx, rx) = mpsc::unbounded_channel::<Due<Option<After>>>();
    let reader = async move {
        let mut faults = shared.switch.subscribe();
        let mut chunk = vec![0u8; 64 * 1024];
        // Decided on the first request.
        let mut counted = None;
        loop {
            if let Err(end) = wait_open(&mut faults, generation).await {
                return end;
            }
            let read = tokio::select! {
                read = from.read(&mut chunk) => read,
                // A fault changed (e.g. a blackhole began): look again before reading on.
                _ = faults.changed() => continue,
            };
            let n = match read {
                Ok(0) | Err(_) => return End::Closed,
                Ok(n) => n,
            };
            let counted = *counted.get_or_insert_with(|| !shared.uncounted(&chunk[..n]));
            let cut = if counted { count_request(shared) } else { None };
            let delay = faults.borrow().delay() + shared.held_back(&chunk[..n]);
            if tx
                .send((Instant::now() + delay, chunk[..n].to_vec(), cut))
                .is_err()
            {
                return End::Closed;
            }
        }
    };
    let writer = write_due(to, rx, &shared.switch, generation, |cut: Option<After>| {
        if let Some(after) = cut {
            armed.send_replace(Some((after, Instant::now())));
        }
    });
    fault_switch::pump(reader, writer).await
}

async fn downstream_pump<R, W>(
    mut from: R,
    to: W,
    shared: &Shared,
    armed: &watch::Sender<Option<(After, Instant)>>,
    generation: u64,
) -> End
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (tx, rx) = mpsc::unbounded_channel::<Due<()>>();
    let reader = async move {
        let mut faults = shared.switch.subscribe();
        let mut armed_rx = armed.subscribe();
        let mut chunk = vec![0u8; 64 * 1024];
        loop {
            if let Err(end) = wait_open(&mut faults, generation).await {
                return end;
            }
            let cut = *armed_rx.borrow_and_update();
            let grace = async {
                match cut {
                    Some((_, at)) => tokio::time::sleep_until(at + REPLY_GRACE).await,
                    None => std::future::pending().await,
                }
            };
            let read = tokio::select! {
                read = from.read(&mut chunk) => Some(read),
                _ = faults.changed() => continue,
                _ = armed_rx.changed() => continue,
                // The request got no answer: cut anyway.
                _ = grace => None,
            };
            let bytes = match read {
                Some(Ok(0)) | Some(Err(_)) => return End::Closed,
                Some(Ok(n)) => Some(chunk[..n].to_vec()),
                None => None,
            };
            if let Some((after, _)) = cut {
                shared.group.counters.cuts.fetch_add(1, Ordering::SeqCst);
                match after {
                    After::Reset | After::ResetAndBlackhole => {
                        if after == After::ResetAndBlackhole {
                            shared.group.blackhole();
                        }
                        // Swallow what else comes a moment, so the server has read the request.
                        swallow(&mut from, &mut chunk, SETTLE).await;
                        return End::Reset;
                    }
                    After::Blackhole => {
                        // Held, not lost: the writer waits for the partition to end.
                        shared.group.blackhole();
                        armed.send_replace(None);
                        armed_rx.borrow_and_update();
                    }
                }
            }
            if let Some(bytes) = bytes {
                shared.group.counters.replies.fetch_add(1, Ordering::SeqCst);
                let delay = faults.borrow().delay();
                if tx.send((Instant::now() + delay, bytes, ())).is_err() {
                    return End::Closed;
                }
            }
        }
    };
    let writer = write_due(to, rx, &shared.switch, generation, |()| {});
    fault_switch::pump(reader, writer).await
}

/// Reads and discards what `from` sends for `settle` (or until it closes).
async fn swallow<R>(from: &mut R, chunk: &mut [u8], settle: Duration)
where
    R: tokio::io::AsyncRead + Unpin,
{
    let settle = tokio::time::sleep(settle);
    tokio::pin!(settle);
    loop {
        tokio::select! {
            _ = &mut settle => return,
            read = from.read(chunk) => {
                if !matches!(read, Ok(n) if n > 0) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::Ipv4Addr;
    use std::net::TcpStream as StdStream;

    /// A tiny echo server on a loopback port: every chunk it reads, it writes back.
    fn echo() -> SocketAddr {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut s) = stream else { return };
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    while let Ok(n) = s.read(&mut buf) {
                        if n == 0 || s.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn connect(relay: &Relay) -> StdStream {
        let s = StdStream::connect(relay.addr()).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.set_nodelay(true).unwrap();
        s
    }

    /// Sends `msg` and reads its echo.
    fn turn(s: &mut StdStream, msg: &[u8]) -> io::Result<Vec<u8>> {
        s.write_all(msg)?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got)?;
        Ok(got)
    }

    /// Whether the next read ends the connection (an error or EOF) rather than timing out.
    fn ended(s: &mut StdStream) -> bool {
        s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
        let mut b = [0u8; 16];
        match s.read(&mut b) {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(
                e.kind(),
                io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
            ),
        }
    }

    fn relay() -> (Relay, SocketAddr) {
        let upstream = echo();
        (Relay::start(&upstream.to_string()).unwrap(), upstream)
    }

    #[test]
    fn forwards_and_counts_turns() {
        let (relay, upstream) = relay();
        assert_eq!(relay.upstream(), upstream);
        let mut s = connect(&relay);
        for i in 0..5u8 {
            assert_eq!(turn(&mut s, &[i; 10]).unwrap(), vec![i; 10]);
        }
        let stats = relay.stats();
        assert_eq!(stats.connections, 1);
        assert_eq!(stats.requests, 5);
        assert_eq!(relay.requests(), 5);
        assert!(stats.replies >= 5);
    }

    #[test]
    fn rewrites_urls() {
        let relay = Relay::start("127.0.0.1:5432").unwrap();
        assert_eq!(
            relay.url("postgres://postgres@127.0.0.1:5432/postgres"),
            format!("postgres://postgres@127.0.0.1:{}/postgres", relay.port())
        );
        assert_eq!(
            relay.url("redis://localhost:5432/"),
            format!("redis://127.0.0.1:{}/", relay.port())
        );
    }

    #[test]
    fn blackhole_holds_and_heal_delivers() {
        let (relay, _) = relay();
        let mut s = connect(&relay);
        turn(&mut s, b"one").unwrap();
        relay.blackhole();
        assert!(relay.is_blackholed());
        s.write_all(b"two").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut b = [0u8; 3];
        assert!(s.read_exact(&mut b).is_err(), "nothing passes a blackhole");
        relay.heal();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"two", "what was held is delivered");
    }

    #[test]
    fn reset_and_refuse() {
        let (relay, _) = relay();
        let mut s = connect(&relay);
        turn(&mut s, b"hi").unwrap();
        relay.reset();
        assert!(ended(&mut s), "a reset ends the connection");
        let mut again = connect(&relay);
        assert_eq!(turn(&mut again, b"back").unwrap(), b"back");
        relay.refuse(true);
        assert!(ended(&mut again), "refusing resets open connections");
        let mut refused = connect(&relay);
        assert!(ended(&mut refused), "and new ones");
        relay.refuse(false);
        let mut ok = connect(&relay);
        assert_eq!(turn(&mut ok, b"ok").unwrap(), b"ok");
        assert!(relay.stats().resets >= 3);
    }

    #[test]
    fn delays_each_way() {
        let (relay, _) = relay();
        let mut s = connect(&relay);
        relay.set_delay(Duration::from_millis(100));
        let start = std::time::Instant::now();
        turn(&mut s, b"slow").unwrap();
        assert!(start.elapsed() >= Duration::from_millis(200));
        relay.set_delay(Duration::ZERO);
    }

    #[test]
    fn the_cut_lets_the_nth_request_through_and_withholds_its_reply() {
        let (relay, _) = relay();
        let mut s = connect(&relay);
        turn(&mut s, b"first").unwrap();
        relay.cut_after_nth_request(2, After::Reset);
        assert!(relay.cut_pending());
        turn(&mut s, b"second").unwrap();
        s.write_all(b"third").unwrap();
        assert!(ended(&mut s), "reset with the reply withheld");
        assert!(!relay.cut_pending());
        assert_eq!(relay.stats().cuts, 1);
        assert!(!relay.is_blackholed());
        // Other connections and new ones carry on.
        let mut again = connect(&relay);
        assert_eq!(turn(&mut again, b"after").unwrap(), b"after");
    }

    #[test]
    fn the_cut_with_a_blackhole_holds_until_healed() {
        let (relay, _) = relay();
        let mut other = connect(&relay);
        let mut s = connect(&relay);
        relay.cut_after_nth_request(1, After::ResetAndBlackhole);
        s.write_all(b"x").unwrap();
        assert!(ended(&mut s));
        assert!(relay.is_blackholed());
        other.write_all(b"held").unwrap();
        other
            .set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        let mut b = [0u8; 4];
        assert!(other.read_exact(&mut b).is_err());
        relay.heal();
        other
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        other.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"held");
    }

    #[test]
    fn the_partition_cut_resets_nothing_and_heal_delivers_the_reply() {
        let (relay, _) = relay();
        let mut s = connect(&relay);
        relay.cut_after_nth_request(1, After::Blackhole);
        s.write_all(b"asked").unwrap();
        s.set_read_timeout(Some(Duration::from_millis(500)))
            .unwrap();
        let mut b = [0u8; 5];
        assert!(s.read_exact(&mut b).is_err(), "the reply is withheld");
        assert!(relay.is_blackholed());
        assert_eq!(relay.stats().cuts, 1);
        assert_eq!(relay.stats().resets, 0);
        relay.heal();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"asked");
        assert_eq!(turn(&mut s, b"more").unwrap(), b"more");
    }

    #[test]
    fn relays_beside_each_other_count_and_cut_together() {
        let (first, _) = relay();
        let second = first.start_beside(&echo().to_string()).unwrap();
        let (mut a, mut b) = (connect(&first), connect(&second));
        turn(&mut a, b"1").unwrap();
        turn(&mut b, b"2").unwrap();
        assert_eq!((first.requests(), second.requests()), (2, 2));
        // The 2nd request from now on, whichever relay it reaches.
        second.cut_after_nth_request(2, After::ResetAndBlackhole);
        assert!(first.cut_pending());
        turn(&mut b, b"3").unwrap();
        a.write_all(b"4").unwrap();
        assert!(
            ended(&mut a),
            "the cut fires on the other relay's connection"
        );
        assert!(first.is_blackholed() && second.is_blackholed());
        assert_eq!(first.stats().cuts, 1);
        first.heal();
        assert!(second.is_blackholed(), "each relay heals on its own");
        second.heal();
        turn(&mut b, b"5").unwrap();
    }

    #[test]
    fn connections_that_say_so_first_go_uncounted() {
        let (relay, _) = relay();
        relay.uncounted_when_first_request_has(b"third");
        let mut third = connect(&relay);
        let mut client = connect(&relay);
        relay.cut_after_nth_request(2, After::Reset);
        turn(&mut third, b"a third party").unwrap();
        turn(&mut client, b"one").unwrap();
        for _ in 0..3 {
            turn(&mut third, b"more").unwrap();
        }
        assert_eq!(relay.requests(), 1, "only the client's");
        client.write_all(b"two").unwrap();
        assert!(ended(&mut client), "the cut falls on the client's 2nd");
        turn(&mut third, b"on").unwrap();
    }

    #[test]
    fn a_request_with_no_answer_is_cut_after_a_grace() {
        // A server that reads and never answers.
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let upstream = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in listener.incoming().flatten() {
                let mut r = s.try_clone().unwrap();
                std::thread::spawn(move || {
                    let mut b = [0u8; 64];
                    while matches!(r.read(&mut b), Ok(n) if n > 0) {}
                });
                held.push(s);
            }
        });
        let relay = Relay::start(&upstream.to_string()).unwrap();
        let mut s = connect(&relay);
        relay.cut_after_nth_request(1, After::Reset);
        s.write_all(b"silence").unwrap();
        assert!(ended(&mut s));
        assert_eq!(relay.stats().cuts, 1);
    }

    #[test]
    fn dropping_the_relay_resets_its_connections() {
        let (relay, _) = relay();
        let mut s = connect(&relay);
        turn(&mut s, b"x").unwrap();
        drop(relay);
        assert!(ended(&mut s));
    }
}
