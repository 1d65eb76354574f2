//! A fault-injecting TCP proxy between ZooKeeper clients and a server, aware of ZooKeeper's framing.
//!
//! Every frame on a ZooKeeper connection is a 4-byte big-endian length and that many bytes. The first
//! frame each way is the session handshake (ConnectRequest / ConnectResponse, no xid); every later
//! request starts with its xid and opcode, every reply with the xid it answers. That is enough to count
//! creates and lose exactly the reply to one of them.

use std::collections::HashMap;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::fault_switch::{self, write_due, Due, End, FaultSwitch, Link};
use crate::listening::Listening;

/// ZooKeeper opcodes of the requests that create a znode: create, create2, createContainer, createTTL.
pub const CREATE_OPCODES: [i32; 4] = [1, 15, 19, 21];

/// Frames longer than this are not ZooKeeper's (e.g. a four-letter word): the connection is then
/// passed through as raw bytes.
const MAX_FRAME: usize = 64 << 20;

/// The runtime every proxy of the process runs on: one worker thread, alive as long as the process.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    fault_switch::runtime(&RUNTIME, "zklock-testkit-proxy")
}

/// Drop the reply to the `remaining`-th next request with one of `opcodes`.
#[derive(Debug)]
struct DropRule {
    opcodes: Vec<i32>,
    remaining: u64,
    after: AfterDrop,
}

/// What the proxy does once it has withheld a reply (see [`Proxy::drop_reply_to_nth_with`]).
///
/// # Examples
///
/// ```no_run
/// use zklock_testkit::{AfterDrop, Proxy, CREATE_OPCODES};
/// # let server = zklock_testkit::ZkServer::start()?;
/// let proxy = Proxy::start(&server.connect_string())?;
/// proxy.drop_reply_to_nth_with(&CREATE_OPCODES, 1, AfterDrop::ResetAndBlackhole);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum AfterDrop {
    /// Reset that connection; the client reconnects at once.
    Reset,
    /// Reset that connection and [`blackhole`](Proxy::blackhole) the proxy until
    /// [`heal`](Proxy::heal): the network went down right after the server committed.
    ResetAndBlackhole,
}

/// What the proxy counts beyond the switch's connections and resets.
#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    replies: AtomicU64,
    creates: AtomicU64,
    replies_dropped: AtomicU64,
    requests_held: AtomicU64,
}

/// What the proxy's connections share: the fault switch, the rule for the reply to drop, and
/// the counts.
struct Shared {
    switch: FaultSwitch,
    drop_rule: Mutex<Option<DropRule>>,
    counters: Counters,
    /// Requests seen, by opcode.
    opcodes: Mutex<HashMap<i32, u64>>,
}

/// What the proxy has seen so far; see [`Proxy::stats`].
///
/// # Examples
///
/// ```no_run
/// let server = zklock_testkit::ZkServer::start()?;
/// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
/// // ... a client connects to proxy.connect_string() ...
/// let stats = proxy.stats();
/// println!("{} connections, {} creates", stats.connections, stats.creates);
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ProxyStats {
    /// Client connections accepted.
    pub connections: u64,
    /// Request frames forwarded to the server (handshakes included).
    pub requests: u64,
    /// Reply and event frames forwarded to clients (handshakes included).
    pub replies: u64,
    /// Create requests seen (any of [`CREATE_OPCODES`]).
    pub creates: u64,
    /// Replies withheld by [`Proxy::drop_reply_to_nth_create`] or [`Proxy::drop_reply_to_nth`].
    pub replies_dropped: u64,
    /// Connections reset by the proxy (by [`Proxy::reset`], [`Proxy::refuse`], or after a dropped reply).
    pub resets: u64,
    /// Times a client's bytes were stopped by [`Proxy::hold_requests`] (once per connection
    /// until it is healed).
    pub requests_held: u64,
}

/// A fault-injecting TCP proxy in front of one ZooKeeper server: point a client at
/// [`connect_string`](Self::connect_string) instead of the server's, then cut it off
/// ([`blackhole`](Self::blackhole)), reset its connections ([`reset`](Self::reset)), slow it down
/// ([`set_delay`](Self::set_delay)) or lose the reply to one of its creates
/// ([`drop_reply_to_nth_create`](Self::drop_reply_to_nth_create)).
///
/// The proxy listens on a free loopback port (kept for its whole life, so clients reconnect to the
/// same address) and runs on a small runtime of its own, so it serves blocking and async tests alike.
/// For an ensemble, start one proxy per member and join their connect strings with commas. Dropping
/// the proxy resets every connection through it.
///
/// netem is not available in unprivileged test environments; this is its stand-in for what a lock
/// client must survive: partitions, dead connections, slow links and lost replies.
///
/// # Examples
///
/// ```no_run
/// use std::time::Duration;
/// use zklock_testkit::{Proxy, ZkServer};
///
/// let server = ZkServer::start()?;
/// let proxy = Proxy::start(&server.connect_string())?;
/// let connect = proxy.connect_string(); // give this to the client under test
/// proxy.blackhole(); // a partition: the client's session times out on the server
/// // ...
/// proxy.heal();
/// proxy.set_delay(Duration::from_millis(50));
/// proxy.drop_reply_to_nth_create(1); // the next create happens, but its reply never arrives
/// # let _ = connect;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Proxy {
    shared: Listening<Shared>,
}

impl fmt::Debug for Proxy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.debug("Proxy", f)
    }
}

impl Proxy {
    /// Starts a proxy to `upstream` (`"host:port"`, e.g. [`ZkServer::connect_string`](crate::ZkServer::connect_string))
    /// on a free loopback port. It forwards everything until told otherwise.
    ///
    /// # Errors
    ///
    /// When `upstream` does not resolve or no loopback port can be bound.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// assert_ne!(proxy.port(), server.port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(upstream: &str) -> io::Result<Proxy> {
        let shared = Listening::start(
            upstream,
            runtime(),
            |switch| Shared {
                switch,
                drop_rule: Mutex::new(None),
                counters: Counters::default(),
                opcodes: Mutex::new(HashMap::new()),
            },
            serve,
        )?;
        Ok(Proxy { shared })
    }

    /// `"127.0.0.1:PORT"` of the proxy, for a ZooKeeper client.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// assert!(proxy.connect_string().starts_with("127.0.0.1:"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn connect_string(&self) -> String {
        self.shared.addr().to_string()
    }

    /// The proxy's port.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// assert_ne!(proxy.port(), 0);
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
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// assert_eq!(proxy.upstream().port(), server.port());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn upstream(&self) -> SocketAddr {
        self.shared.upstream()
    }

    fault_switch::switch_controls!(
        "# let server = zklock_testkit::ZkServer::start()?;\nlet proxy = zklock_testkit::Proxy::start(&server.connect_string())?;",
        "proxy"
    );

    /// Cuts the clients off one way: what they send from now on is held (requests, renewals,
    /// keep-alives go nowhere), while what the server sends still reaches them (replies to
    /// what got through before, pushes, pub/sub messages). Connections stay open;
    /// [`heal`](Self::heal) delivers what was held. [`stats`](Self::stats) counts the
    /// connections it stopped bytes on (`requests_held`), so a test can tell whether a client
    /// sent anything since.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// proxy.hold_requests();
    /// // ... the server's word reaches the client, the client's answer does not ...
    /// assert_eq!(proxy.stats().requests_held, 0); // the client sent nothing yet
    /// proxy.heal();
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn hold_requests(&self) {
        self.shared.switch.hold_requests();
    }

    /// Loses the reply to the `n`-th create request (1 = the next one) that passes through from now
    /// on: the server performs the create, the reply is withheld, and the connection is reset at that
    /// moment — what a client sees when a connection dies between the server's commit and its answer.
    /// Creates are requests with one of [`CREATE_OPCODES`]; [`stats`](Self::stats) counts the drop.
    ///
    /// # Panics
    ///
    /// When `n` is 0.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// proxy.drop_reply_to_nth_create(1);
    /// // ... the client's next create succeeds on the server but it sees connection loss ...
    /// assert_eq!(proxy.stats().replies_dropped, 0); // nothing created yet
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn drop_reply_to_nth_create(&self, n: u64) {
        self.drop_reply_to_nth_with(&CREATE_OPCODES, n, AfterDrop::Reset);
    }

    /// Loses the reply to the `n`-th request (1 = the next one) with one of `opcodes`, as
    /// [`drop_reply_to_nth_create`](Self::drop_reply_to_nth_create) does for creates. Replaces a rule
    /// that has not fired yet.
    ///
    /// # Panics
    ///
    /// When `n` is 0 or `opcodes` is empty.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// const DELETE: i32 = 2;
    /// proxy.drop_reply_to_nth(&[DELETE], 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn drop_reply_to_nth(&self, opcodes: &[i32], n: u64) {
        self.drop_reply_to_nth_with(opcodes, n, AfterDrop::Reset);
    }

    /// Loses the reply to the `n`-th request with one of `opcodes`, as
    /// [`drop_reply_to_nth`](Self::drop_reply_to_nth) does, then does what `after` says.
    ///
    /// # Panics
    ///
    /// When `n` is 0 or `opcodes` is empty.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use zklock_testkit::{AfterDrop, Proxy, CREATE_OPCODES};
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = Proxy::start(&server.connect_string())?;
    /// // The create is committed, then the client is cut off until `heal`.
    /// proxy.drop_reply_to_nth_with(&CREATE_OPCODES, 1, AfterDrop::ResetAndBlackhole);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn drop_reply_to_nth_with(&self, opcodes: &[i32], n: u64, after: AfterDrop) {
        assert!(n > 0, "n counts from 1");
        assert!(!opcodes.is_empty(), "name at least one opcode");
        *self
            .shared
            .drop_rule
            .lock()
            .unwrap_or_else(|e| e.into_inner()) = Some(DropRule {
            opcodes: opcodes.to_vec(),
            remaining: n,
            after,
        });
    }

    /// Whether a drop rule is armed and has not fired yet.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// proxy.drop_reply_to_nth_create(2);
    /// assert!(proxy.drop_pending());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn drop_pending(&self) -> bool {
        self.shared
            .drop_rule
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// How many requests with `opcode` (e.g. 2 for delete, 8 for getChildren) clients have sent
    /// through the proxy so far. They are counted as they arrive, before any delay.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// const DELETE: i32 = 2;
    /// assert_eq!(proxy.requests_with(DELETE), 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn requests_with(&self, opcode: i32) -> u64 {
        self.shared
            .opcodes
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&opcode)
            .copied()
            .unwrap_or(0)
    }

    /// What the proxy has seen and done so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let server = zklock_testkit::ZkServer::start()?;
    /// let proxy = zklock_testkit::Proxy::start(&server.connect_string())?;
    /// assert_eq!(proxy.stats().connections, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stats(&self) -> ProxyStats {
        let c = &self.shared.counters;
        ProxyStats {
            connections: self.shared.switch.connections(),
            requests: c.requests.load(Ordering::SeqCst),
            replies: c.replies.load(Ordering::SeqCst),
            creates: c.creates.load(Ordering::SeqCst),
            replies_dropped: c.replies_dropped.load(Ordering::SeqCst),
            resets: self.shared.switch.resets(),
            requests_held: c.requests_held.load(Ordering::SeqCst),
        }
    }
}

impl AsRef<FaultSwitch> for Shared {
    fn as_ref(&self) -> &FaultSwitch {
        &self.switch
    }
}

/// One client's connection: to the server, with a pump each way.
async fn serve(client: TcpStream, shared: Arc<Shared>) {
    let Some(mut link) = Link::open(&shared.switch, client).await else {
        return;
    };
    let drop_xids = Mutex::new(HashMap::new());
    let generation = link.generation;
    let end = {
        let h = link.split();
        let up = pump(
            h.client_read,
            h.server_write,
            Direction::ToServer,
            &shared,
            &drop_xids,
            generation,
        );
        let down = pump(
            h.server_read,
            h.client_write,
            Direction::ToClient,
            &shared,
            &drop_xids,
            generation,
        );
        fault_switch::race(&shared.switch, generation, up, down).await
    };
    link.end(&shared.switch, end);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    ToServer,
    ToClient,
}

/// What to do with one frame.
enum Verdict {
    Forward,
    /// Withhold it and reset the connection.
    DropAndReset,
}

/// Looks at one complete frame (length prefix included).
fn inspect(
    frame: &[u8],
    handshake: bool,
    dir: Direction,
    shared: &Shared,
    drop_xids: &Mutex<HashMap<i32, AfterDrop>>,
) -> Verdict {
    let counters = &shared.counters;
    match dir {
        Direction::ToServer => {
            counters.requests.fetch_add(1, Ordering::SeqCst);
            if handshake || frame.len() < 12 {
                return Verdict::Forward;
            }
            let xid = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
            let opcode = i32::from_be_bytes([frame[8], frame[9], frame[10], frame[11]]);
            if CREATE_OPCODES.contains(&opcode) {
                counters.creates.fetch_add(1, Ordering::SeqCst);
            }
            *shared
                .opcodes
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(opcode)
                .or_default() += 1;
            let mut rule = shared.drop_rule.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(r) = rule.as_mut().filter(|r| r.opcodes.contains(&opcode)) {
                r.remaining -= 1;
                if r.remaining == 0 {
                    drop_xids
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(xid, r.after);
                    *rule = None;
                }
            }
            Verdict::Forward
        }
        Direction::ToClient => {
            if !handshake && frame.len() >= 8 {
                let xid = i32::from_be_bytes([frame[4], frame[5], frame[6], frame[7]]);
                let dropped = drop_xids
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .remove(&xid);
                if let Some(after) = dropped {
                    counters.replies_dropped.fetch_add(1, Ordering::SeqCst);
                    if after == AfterDrop::ResetAndBlackhole {
                        shared.switch.blackhole();
                    }
                    return Verdict::DropAndReset;
                }
            }
            counters.replies.fetch_add(1, Ordering::SeqCst);
            Verdict::Forward
        }
    }
}

/// The next complete frame at the start of `buf`, taken out of it (`None`: none complete yet).
/// What does not parse as ZooKeeper's length-prefixed frames (a length out of range) turns the
/// stream `raw`: from then on, whatever is in the buffer is handed on as it comes.
fn next_frame(buf: &mut Vec<u8>, raw: &mut bool) -> Option<Vec<u8>> {
    if !*raw {
        if buf.len() < 4 {
            return None;
        }
        let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
        if len >= 0 && len as usize <= MAX_FRAME {
            let total = 4 + len as usize;
            if buf.len() < total {
                return None;
            }
            let rest = buf.split_off(total);
            return Some(std::mem::replace(buf, rest));
        }
        *raw = true;
    }
    (!buf.is_empty()).then(|| std::mem::take(buf))
}

/// Forwards frames from `from` to `to`, applying the proxy's faults.
async fn pump<R, W>(
    mut from: R,
    to: W,
    dir: Direction,
    shared: &Shared,
    drop_xids: &Mutex<HashMap<i32, AfterDrop>>,
    generation: u64,
) -> End
where
    R: tokio::io::AsyncRead + Unpin,
    W: tokio::io::AsyncWrite + Unpin,
{
    let (tx, rx) = mpsc::unbounded_channel::<Due<()>>();
    let switch = &shared.switch;
    let reader = async move {
        let mut faults = switch.subscribe();
        let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
        let mut chunk = vec![0u8; 64 * 1024];
        let mut handshake = true;
        let mut raw = false;
        // The bytes in the buffer were counted as held.
        let mut held_counted = false;
        loop {
            if let Err(end) = fault_switch::wait_open(&mut faults, generation).await {
                return end;
            }
            // A one-way hold keeps what the client sent in the buffer (reading on, so that a
            // close is seen), and hands nothing on until it ends.
            let held = dir == Direction::ToServer && faults.borrow().requests_held();
            if !held {
                held_counted = false;
            } else if !buf.is_empty() && !held_counted {
                let held_total = &shared.counters.requests_held;
                held_total.fetch_add(1, Ordering::SeqCst);
                held_counted = true;
            }
            // Hand on every complete frame in the buffer (none while held).
            loop {
                if held {
                    break;
                }
                let Some(frame) = next_frame(&mut buf, &mut raw) else {
                    break;
                };
                if !raw {
                    match inspect(&frame, handshake, dir, shared, drop_xids) {
                        Verdict::Forward => {}
                        Verdict::DropAndReset => return End::Reset,
                    }
                    handshake = false;
                }
                let delay = faults.borrow().delay();
                if tx.send((Instant::now() + delay, frame, ())).is_err() {
                    return End::Closed;
                }
            }
            let read = tokio::select! {
                read = from.read(&mut chunk) => read,
                // A fault changed (e.g. a blackhole began): look again before reading on.
                _ = faults.changed() => continue,
            };
            match read {
                Ok(0) | Err(_) => return End::Closed,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
    };
    let writer = write_due(to, rx, switch, generation, |()| {});
    fault_switch::pump(reader, writer).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(body: &[u8]) -> Vec<u8> {
        let mut f = (body.len() as i32).to_be_bytes().to_vec();
        f.extend_from_slice(body);
        f
    }

    fn shared() -> Shared {
        Shared {
            switch: FaultSwitch::new("127.0.0.1:1".parse().unwrap()),
            drop_rule: Mutex::new(None),
            counters: Counters::default(),
            opcodes: Mutex::new(HashMap::new()),
        }
    }

    #[test]
    fn drops_the_reply_to_the_nth_create_only() {
        let s = shared();
        *s.drop_rule.lock().unwrap() = Some(DropRule {
            opcodes: CREATE_OPCODES.to_vec(),
            remaining: 2,
            after: AfterDrop::Reset,
        });
        let xids = Mutex::new(HashMap::new());
        let request = |xid: i32, op: i32| {
            let mut b = xid.to_be_bytes().to_vec();
            b.extend(op.to_be_bytes());
            b.extend([0u8; 8]);
            frame(&b)
        };
        let reply = |xid: i32| {
            let mut b = xid.to_be_bytes().to_vec();
            b.extend([0u8; 12]);
            frame(&b)
        };
        // The handshake is never taken for a request.
        let hello = frame(&[0u8; 44]);
        assert!(matches!(
            inspect(&hello, true, Direction::ToServer, &s, &xids),
            Verdict::Forward
        ));
        for (xid, op) in [(1, 15), (2, 8), (3, 19), (4, 1)] {
            assert!(matches!(
                inspect(&request(xid, op), false, Direction::ToServer, &s, &xids),
                Verdict::Forward
            ));
        }
        assert_eq!(s.counters.creates.load(Ordering::SeqCst), 3);
        assert!(s.drop_rule.lock().unwrap().is_none(), "the rule fired once");
        for xid in [1, 2, 4, -2] {
            assert!(matches!(
                inspect(&reply(xid), false, Direction::ToClient, &s, &xids),
                Verdict::Forward
            ));
        }
        assert!(matches!(
            inspect(&reply(3), false, Direction::ToClient, &s, &xids),
            Verdict::DropAndReset
        ));
        assert_eq!(s.counters.replies_dropped.load(Ordering::SeqCst), 1);
    }

    /// A one-way hold: the server's bytes still reach the client; the client's stop at the
    /// proxy (counted) until the heal delivers them.
    #[test]
    fn a_request_hold_stops_what_clients_send_only() {
        use std::io::{Read, Write};
        let server = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = Proxy::start(&server.local_addr().unwrap().to_string()).unwrap();
        let mut client = std::net::TcpStream::connect(proxy.connect_string()).unwrap();
        let (mut upstream, _) = server.accept().unwrap();
        for s in [&client, &upstream] {
            s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        }
        proxy.hold_requests();
        client.write_all(b"+request\r\n").unwrap();
        upstream.write_all(b"+push\r\n").unwrap();
        let mut push = [0u8; 7];
        client.read_exact(&mut push).unwrap();
        assert_eq!(&push, b"+push\r\n");
        let until = std::time::Instant::now() + Duration::from_secs(5);
        while proxy.stats().requests_held == 0 {
            assert!(
                std::time::Instant::now() < until,
                "the request never reached the proxy"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        upstream.set_nonblocking(true).unwrap();
        let mut got = [0u8; 10];
        assert_eq!(
            upstream.read(&mut got).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::WouldBlock),
            "a held request reached the server"
        );
        upstream.set_nonblocking(false).unwrap();
        proxy.heal();
        upstream.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"+request\r\n");
        assert_eq!(proxy.stats().requests_held, 1);
    }
}
