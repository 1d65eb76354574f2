//! A PostgreSQL relay that plays the server's late second cancel signal.
//!
//! PostgreSQL answers one cancel request (the protocol's `CancelRequest`, sent on a connection
//! of its own) by signalling the session's process twice, and the client hears nothing of when
//! it did: when the server is descheduled between the two signals, the second one lands on
//! whatever the session runs next. [`LateCancel`] makes that certain instead of rare: it
//! forwards every cancel request as usual, and then sends the same request again once the
//! session it named has finished the cancelled statement and runs another one that has not
//! answered within [`LateCancel::ECHO_AFTER`] (a statement that waits, such as a lock's).
//!
//! It reads just enough of the protocol: the first packet of each connection (a startup
//! packet, or a cancel request with the session's process id and secret key), and the server's
//! messages (a type byte and a length), for the session's key (`BackendKeyData`) and the end of
//! each statement (`ReadyForQuery`). What the client sends after its startup packet is passed
//! through unread: any bytes sent while the session is idle start a statement.

use std::collections::HashMap;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::fault_switch;

/// The protocol's code of a cancel request, in place of a protocol version.
const CANCEL_REQUEST: i32 = 80_877_102;
/// The codes of a request for TLS or GSS encryption: refused here (`N`), as a server without
/// them does; the client then sends its startup packet in the clear.
const ENCRYPTION_REQUESTS: [i32; 2] = [80_877_103, 80_877_104];
/// The longest startup packet accepted.
const MAX_STARTUP: usize = 10_000;
/// How long a session stays armed after its cancel request: past that, no echo.
const ARMED_FOR: Duration = Duration::from_secs(2);

fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    fault_switch::runtime(&RUNTIME, "zklock-testkit-late-cancel")
}

/// A session's cancel key: its process id and secret.
type Key = (i32, i32);

/// What the relay knows of one session.
#[derive(Default)]
struct Session {
    /// A cancel request for it was forwarded at this time, and not echoed yet.
    armed: Option<Instant>,
    /// The cancelled statement has answered since the cancel request came.
    answered: bool,
    /// A statement runs (bytes came from the client since the last `ReadyForQuery`): counted,
    /// so that a timer knows whether the statement it was started for still runs.
    running: Option<u64>,
    statements: u64,
}

#[derive(Default)]
struct Shared {
    sessions: Mutex<HashMap<Key, Session>>,
    connections: AtomicU64,
    cancels: AtomicU64,
    echoes: AtomicU64,
}

impl Shared {
    fn session<T>(&self, key: Key, f: impl FnOnce(&mut Session) -> T) -> T {
        let mut sessions = self.sessions.lock().unwrap_or_else(|e| e.into_inner());
        f(sessions.entry(key).or_default())
    }
}

/// What a [`LateCancel`] relay has seen; see [`LateCancel::stats`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct LateCancelStats {
    /// Client connections accepted (sessions and cancel requests).
    pub connections: u64,
    /// Cancel requests forwarded from clients.
    pub cancels: u64,
    /// Cancel requests sent again, late, while a later statement of the session ran.
    pub echoes: u64,
}

/// A relay to a PostgreSQL server that sends each cancel request a second time, late: see the
/// module's docs.
///
/// # Examples
///
/// ```no_run
/// # let pg = zklock_testkit::PostgresServer::start()?;
/// let relay = zklock_testkit::LateCancel::start(&format!("127.0.0.1:{}", pg.port()))?;
/// let url = relay.url(&pg.url()); // clients connect here
/// // ... a client cancels a statement, then runs a long one on the same session ...
/// println!("{} cancels, {} sent again", relay.stats().cancels, relay.stats().echoes);
/// # let _ = url;
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct LateCancel {
    shared: Arc<Shared>,
    addr: SocketAddr,
    upstream: SocketAddr,
    closed: watch::Sender<bool>,
}

impl std::fmt::Debug for LateCancel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LateCancel")
            .field("listen", &self.addr)
            .field("upstream", &self.upstream)
            .finish()
    }
}

impl LateCancel {
    /// How long a statement started after a cancelled one runs without an answer before the
    /// cancel request is sent again: long enough that the server has read it.
    pub const ECHO_AFTER: Duration = Duration::from_millis(20);

    /// Starts the relay to `upstream` (`"host:port"`) on a free loopback port.
    ///
    /// # Errors
    ///
    /// When `upstream` does not resolve or no loopback port can be bound.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::LateCancel::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// assert_ne!(relay.url(&pg.url()), pg.url());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn start(upstream: &str) -> io::Result<LateCancel> {
        let upstream = upstream.to_socket_addrs()?.next().ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "upstream has no address")
        })?;
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let listener = {
            let _enter = runtime().enter();
            TcpListener::from_std(listener)?
        };
        let shared = Arc::new(Shared::default());
        let closed = watch::Sender::new(false);
        runtime().spawn(accept(
            listener,
            upstream,
            shared.clone(),
            closed.subscribe(),
        ));
        Ok(LateCancel {
            shared,
            addr,
            upstream,
            closed,
        })
    }

    /// `url` (a [`PostgresServer::url`](crate::PostgresServer::url)) with the server's
    /// `host:port` replaced by the relay's.
    ///
    /// # Panics
    ///
    /// When `url` does not name the upstream's `127.0.0.1:PORT` or `localhost:PORT`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::LateCancel::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// assert!(relay.url(&pg.url()).starts_with("postgres"));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn url(&self, url: &str) -> String {
        fault_switch::reroute(url, self.upstream, self.addr)
    }

    /// What the relay has seen so far.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # let pg = zklock_testkit::PostgresServer::start()?;
    /// let relay = zklock_testkit::LateCancel::start(&format!("127.0.0.1:{}", pg.port()))?;
    /// assert_eq!(relay.stats().echoes, 0);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn stats(&self) -> LateCancelStats {
        LateCancelStats {
            connections: self.shared.connections.load(Ordering::SeqCst),
            cancels: self.shared.cancels.load(Ordering::SeqCst),
            echoes: self.shared.echoes.load(Ordering::SeqCst),
        }
    }
}

impl Drop for LateCancel {
    fn drop(&mut self) {
        self.closed.send_replace(true);
    }
}

async fn accept(
    listener: TcpListener,
    upstream: SocketAddr,
    shared: Arc<Shared>,
    mut closed: watch::Receiver<bool>,
) {
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = closed.wait_for(|c| *c) => return,
        };
        let Ok((client, _)) = accepted else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        shared.connections.fetch_add(1, Ordering::SeqCst);
        let (shared, mut closed) = (shared.clone(), closed.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = serve(client, upstream, shared) => {}
                _ = closed.wait_for(|c| *c) => {}
            }
        });
    }
}

/// Reads one startup-phase packet: its length (which counts itself) and the rest.
async fn read_packet(client: &mut TcpStream) -> io::Result<Vec<u8>> {
    let len = client.read_i32().await?;
    let len = usize::try_from(len)
        .ok()
        .filter(|l| (8..=MAX_STARTUP).contains(l))
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "bad startup packet"))?;
    let mut packet = vec![0; len];
    packet[..4].copy_from_slice(&(len as i32).to_be_bytes());
    client.read_exact(&mut packet[4..]).await?;
    Ok(packet)
}

async fn serve(mut client: TcpStream, upstream: SocketAddr, shared: Arc<Shared>) -> io::Result<()> {
    let startup = loop {
        let packet = read_packet(&mut client).await?;
        let code = i32::from_be_bytes(packet[4..8].try_into().expect("4 bytes"));
        if ENCRYPTION_REQUESTS.contains(&code) {
            client.write_all(b"N").await?;
            continue;
        }
        if code == CANCEL_REQUEST && packet.len() == 16 {
            let pid = i32::from_be_bytes(packet[8..12].try_into().expect("4 bytes"));
            let secret = i32::from_be_bytes(packet[12..16].try_into().expect("4 bytes"));
            shared.cancels.fetch_add(1, Ordering::SeqCst);
            shared.session((pid, secret), |s| {
                s.armed = Some(Instant::now());
                s.answered = false;
            });
            return send_cancel(upstream, &packet).await;
        }
        break packet;
    };
    let server = TcpStream::connect(upstream).await?;
    server.set_nodelay(true)?;
    client.set_nodelay(true)?;
    let (mut server_read, mut server_write) = server.into_split();
    let (mut client_read, mut client_write) = client.into_split();
    server_write.write_all(&startup).await?;
    let key = Arc::new(Mutex::new(None::<Key>));
    let up = {
        let (key, shared) = (key.clone(), shared.clone());
        async move {
            let mut chunk = vec![0; 64 << 10];
            loop {
                let n = client_read.read(&mut chunk).await?;
                if n == 0 {
                    return io::Result::Ok(());
                }
                server_write.write_all(&chunk[..n]).await?;
                let key = *key.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(key) = key {
                    started(&shared, key, upstream);
                }
            }
        }
    };
    let down = async move {
        let mut chunk = vec![0; 64 << 10];
        let mut messages = Messages::default();
        loop {
            let n = server_read.read(&mut chunk).await?;
            if n == 0 {
                return io::Result::Ok(());
            }
            client_write.write_all(&chunk[..n]).await?;
            for message in messages.feed(&chunk[..n]) {
                match message {
                    Message::Key(k) => *key.lock().unwrap_or_else(|e| e.into_inner()) = Some(k),
                    Message::Ready => {
                        let k = *key.lock().unwrap_or_else(|e| e.into_inner());
                        if let Some(k) = k {
                            shared.session(k, |s| {
                                s.running = None;
                                if s.armed.is_some() {
                                    s.answered = true;
                                }
                            });
                        }
                    }
                }
            }
        }
    };
    tokio::select! {
        r = up => r,
        r = down => r,
    }
}

/// Bytes came from the client of session `key`: if the session was idle, a statement starts;
/// if a cancel request for it came and its cancelled statement has answered, the request is
/// sent again unless this statement answers within [`LateCancel::ECHO_AFTER`].
fn started(shared: &Arc<Shared>, key: Key, upstream: SocketAddr) {
    let statement = shared.session(key, |s| {
        if s.running.is_some() {
            return None;
        }
        s.statements += 1;
        s.running = Some(s.statements);
        if s.armed.is_some_and(|at| at.elapsed() > ARMED_FOR) {
            s.armed = None;
        }
        (s.armed.is_some() && s.answered).then_some(s.statements)
    });
    let Some(statement) = statement else { return };
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(LateCancel::ECHO_AFTER).await;
        let echo = shared.session(key, |s| {
            let still = s.running == Some(statement) && s.armed.is_some();
            if still {
                s.armed = None;
            }
            still
        });
        if echo {
            shared.echoes.fetch_add(1, Ordering::SeqCst);
            let mut packet = Vec::with_capacity(16);
            packet.extend_from_slice(&16i32.to_be_bytes());
            packet.extend_from_slice(&CANCEL_REQUEST.to_be_bytes());
            packet.extend_from_slice(&key.0.to_be_bytes());
            packet.extend_from_slice(&key.1.to_be_bytes());
            let _ = send_cancel(upstream, &packet).await;
        }
    });
}

/// Sends a cancel request to the server and waits until the server closes its connection (it
/// has then signalled the session).
async fn send_cancel(upstream: SocketAddr, packet: &[u8]) -> io::Result<()> {
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(packet).await?;
    let mut rest = Vec::new();
    server.read_to_end(&mut rest).await?;
    Ok(())
}

/// What the relay reads in the server's messages.
enum Message {
    /// `BackendKeyData`: the session's cancel key.
    Key(Key),
    /// `ReadyForQuery`: the session is idle.
    Ready,
}

/// The server's messages, split from its byte stream: a type byte, a length that counts itself,
/// the body.
#[derive(Default)]
struct Messages {
    buffered: Vec<u8>,
}

impl Messages {
    fn feed(&mut self, bytes: &[u8]) -> Vec<Message> {
        self.buffered.extend_from_slice(bytes);
        let mut found = Vec::new();
        let mut at = 0;
        while self.buffered.len() >= at + 5 {
            let kind = self.buffered[at];
            let len =
                i32::from_be_bytes(self.buffered[at + 1..at + 5].try_into().expect("4 bytes"));
            let end = at + 1 + len.max(4) as usize;
            if self.buffered.len() < end {
                break;
            }
            let body = &self.buffered[at + 5..end];
            match kind {
                b'K' if body.len() >= 8 => found.push(Message::Key((
                    i32::from_be_bytes(body[..4].try_into().expect("4 bytes")),
                    i32::from_be_bytes(body[4..8].try_into().expect("4 bytes")),
                ))),
                b'Z' => found.push(Message::Ready),
                _ => {}
            }
            at = end;
        }
        self.buffered.drain(..at);
        found
    }
}
