//! The fault switch that the ZooKeeper [`Proxy`](crate::Proxy) and the protocol-blind
//! [`Relay`](crate::Relay) share, and the connection plumbing around it: listening on a free
//! loopback port, refusing or accepting clients, connecting each upstream, pumping bytes with the
//! current delay while no partition holds them, and resetting connections.
//!
//! What the two add is what they look at in the traffic: ZooKeeper's frames (the proxy) or
//! request turns (the relay).

use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;

/// The small runtime in `slot` (one worker thread named `thread_name`), started on first use.
pub(crate) fn runtime(
    slot: &'static OnceLock<Runtime>,
    thread_name: &'static str,
) -> &'static Runtime {
    slot.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(thread_name)
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("start the {thread_name} runtime: {e}"))
    })
}

/// `url` with `upstream`'s `host:port` (`127.0.0.1:PORT` or `localhost:PORT`) replaced by
/// `addr`: the same server, reached through a relay listening on `addr`.
///
/// # Panics
///
/// When `url` does not name `upstream`.
pub(crate) fn reroute(url: &str, upstream: SocketAddr, addr: SocketAddr) -> String {
    let port = upstream.port();
    for host in [upstream.ip().to_string(), "localhost".into()] {
        let from = format!("{host}:{port}");
        if url.contains(&from) {
            return url.replacen(&from, &addr.to_string(), 1);
        }
    }
    panic!("{url} does not name the relay's upstream {upstream}");
}

/// The controls of the [`FaultSwitch`] that a proxy or relay (`$var`, made by the example lines
/// `$open`) stands in front of its server with: partition, heal, reset, refuse, delay.
macro_rules! switch_controls {
    ($open:literal, $var:literal) => {
        /// Cuts the clients off, as a network partition does: nothing is forwarded either way,
        /// open connections stay open (no error, no FIN), new connections are accepted but lead
        /// nowhere. A client hears nothing until it gives up on the connection; the server ends
        /// the session when its timeout or lease runs out. [`heal`](Self::heal) delivers what
        /// was held back, as TCP would once the partition ends.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $open]
        #[doc = concat!($var, ".blackhole();")]
        #[doc = concat!("assert!(", $var, ".is_blackholed());")]
        #[doc = concat!($var, ".heal();")]
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn blackhole(&self) {
            self.shared.switch.blackhole();
        }

        /// Whether [`blackhole`](Self::blackhole) is in force.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $open]
        #[doc = concat!("assert!(!", $var, ".is_blackholed());")]
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn is_blackholed(&self) -> bool {
            self.shared.switch.is_blackholed()
        }

        /// Ends a [`blackhole`](Self::blackhole), a [`refuse`](Self::refuse) and a proxy's
        /// [`hold_requests`](crate::Proxy::hold_requests): traffic flows again (the delay, if any,
        /// stays).
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $open]
        #[doc = concat!($var, ".blackhole();")]
        #[doc = concat!($var, ".heal();")]
        #[doc = concat!("assert!(!", $var, ".is_blackholed());")]
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn heal(&self) {
            self.shared.switch.heal();
        }

        /// Resets (RST) every connection open through it now, both towards the client and towards
        /// the server. New connections are accepted as usual.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $open]
        #[doc = concat!($var, ".reset(); // clients see connection loss and reconnect")]
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn reset(&self) {
            self.shared.switch.reset();
        }

        /// While `on`, new connections are reset as soon as they are accepted (a server that is down);
        /// with `on`, open connections are reset too. [`heal`](Self::heal) or `refuse(false)` ends it.
        ///
        /// # Examples
        ///
        /// ```no_run
        #[doc = $open]
        #[doc = concat!($var, ".refuse(true);")]
        #[doc = concat!($var, ".refuse(false);")]
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn refuse(&self, on: bool) {
            self.shared.switch.refuse(on);
        }

        /// Delays every frame or chunk by `delay`, each way (a round trip gets twice as long);
        /// `Duration::ZERO` ends it. Order is kept.
        ///
        /// # Examples
        ///
        /// ```no_run
        /// # use std::time::Duration;
        #[doc = $open]
        #[doc = concat!($var, ".set_delay(Duration::from_millis(100));")]
        #[doc = concat!($var, ".set_delay(Duration::ZERO);")]
        /// # Ok::<(), std::io::Error>(())
        /// ```
        pub fn set_delay(&self, delay: Duration) {
            self.shared.switch.set_delay(delay);
        }
    };
}
pub(crate) use switch_controls;

/// What the switch does to traffic right now.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Faults {
    /// Nothing goes through either way; connections stay open and new ones are accepted but not
    /// connected upstream. Lifting it delivers what was held back, as TCP would after a partition.
    blackhole: bool,
    /// New connections are reset at once (a server that is down).
    refuse: bool,
    /// What clients send is held, while what the server sends still reaches them: a one-way
    /// partition (only the ZooKeeper proxy's pumps look at it). Lifting it delivers what was
    /// held.
    requests_held: bool,
    /// Added to every frame or chunk, each way.
    delay: Duration,
    /// Bumped to reset every open connection.
    reset_generation: u64,
    /// The proxy or relay was dropped: everything closes.
    closed: bool,
}

impl Faults {
    /// The delay now in force.
    pub(crate) fn delay(&self) -> Duration {
        self.delay
    }

    /// Whether what clients send is held (see [`FaultSwitch::hold_requests`]).
    pub(crate) fn requests_held(&self) -> bool {
        self.requests_held
    }
}

/// How a connection ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum End {
    /// One side closed it (or failed): the other side sees it closed too.
    Closed,
    /// A fault ends it: both sides see it reset.
    Reset,
}

/// The faults now in force, the upstream they stand in front of, and the counts every
/// connection adds to.
#[derive(Debug)]
pub(crate) struct FaultSwitch {
    upstream: SocketAddr,
    faults: watch::Sender<Faults>,
    connections: AtomicU64,
    resets: AtomicU64,
}

impl FaultSwitch {
    /// A switch with no fault in front of `upstream`.
    pub(crate) fn new(upstream: SocketAddr) -> FaultSwitch {
        FaultSwitch {
            upstream,
            faults: watch::Sender::new(Faults::default()),
            connections: AtomicU64::new(0),
            resets: AtomicU64::new(0),
        }
    }

    /// Where connections go.
    pub(crate) fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// The faults now in force.
    pub(crate) fn now(&self) -> Faults {
        *self.faults.borrow()
    }

    /// A receiver of the faults, for a pump.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Faults> {
        self.faults.subscribe()
    }

    /// Starts a partition: nothing passes either way until [`heal`](Self::heal).
    pub(crate) fn blackhole(&self) {
        self.faults.send_modify(|f| f.blackhole = true);
    }

    /// Whether a partition holds.
    pub(crate) fn is_blackholed(&self) -> bool {
        self.faults.borrow().blackhole
    }

    /// Holds what clients send from now on, until [`heal`](Self::heal); what the server sends
    /// still reaches them.
    pub(crate) fn hold_requests(&self) {
        self.faults.send_modify(|f| f.requests_held = true);
    }

    /// Ends a partition (one-way too) and a refusal; what was held back is delivered.
    pub(crate) fn heal(&self) {
        self.faults.send_modify(|f| {
            f.blackhole = false;
            f.refuse = false;
            f.requests_held = false;
        });
    }

    /// Resets every open connection.
    pub(crate) fn reset(&self) {
        self.faults.send_modify(|f| f.reset_generation += 1);
    }

    /// With `on`, resets every open connection and every new one, until `refuse(false)`.
    pub(crate) fn refuse(&self, on: bool) {
        self.faults.send_modify(|f| {
            f.refuse = on;
            if on {
                f.reset_generation += 1;
            }
        });
    }

    /// Delays every frame or chunk by `delay`, each way.
    pub(crate) fn set_delay(&self, delay: Duration) {
        self.faults.send_modify(|f| f.delay = delay);
    }

    /// Closes everything: the listener and every connection.
    pub(crate) fn close(&self) {
        self.faults.send_modify(|f| f.closed = true);
    }

    /// Connections accepted.
    pub(crate) fn connections(&self) -> u64 {
        self.connections.load(Ordering::SeqCst)
    }

    /// Connections reset (refused, reset, cut).
    pub(crate) fn resets(&self) -> u64 {
        self.resets.load(Ordering::SeqCst)
    }

    /// Resets `stream`, and counts it.
    fn reset_one(&self, stream: &TcpStream) {
        self.resets.fetch_add(1, Ordering::SeqCst);
        abort(stream);
    }
}

/// Listens on a free loopback port in front of `upstream`, on `runtime`. Every client accepted
/// while the switch does not refuse goes to `serve`, with the shared state `make` built around
/// the switch; returns that state and the address listened on.
pub(crate) fn listen<S, F>(
    upstream: &str,
    runtime: &'static Runtime,
    make: impl FnOnce(FaultSwitch) -> S,
    serve: fn(TcpStream, Arc<S>) -> F,
) -> io::Result<(Arc<S>, SocketAddr)>
where
    S: AsRef<FaultSwitch> + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let upstream = upstream
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "upstream has no address"))?;
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(make(FaultSwitch::new(upstream)));
    let listener = {
        let _enter = runtime.enter();
        TcpListener::from_std(listener)?
    };
    runtime.spawn(accept_loop(listener, shared.clone(), serve));
    Ok((shared, addr))
}

/// Accepts clients until the switch closes; refuses them while it refuses.
async fn accept_loop<S, F>(listener: TcpListener, shared: Arc<S>, serve: fn(TcpStream, Arc<S>) -> F)
where
    S: AsRef<FaultSwitch> + Send + Sync + 'static,
    F: Future<Output = ()> + Send + 'static,
{
    let switch = (*shared).as_ref();
    let mut faults = switch.faults.subscribe();
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            changed = faults.changed() => {
                if changed.is_err() || faults.borrow().closed {
                    return;
                }
                continue;
            }
        };
        let Ok((client, _)) = accepted else {
            // EMFILE and the like: try again shortly.
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        switch.connections.fetch_add(1, Ordering::SeqCst);
        let now = *faults.borrow();
        if now.closed {
            return;
        }
        if now.refuse {
            switch.reset_one(&client);
            continue;
        }
        tokio::spawn(serve(client, shared.clone()));
    }
}

// A zero linger never blocks on drop (the deprecation warns of non-zero ones): the kernel discards
// unsent data and resets the connection at once.
#[allow(deprecated)]
fn abort(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

/// One client's connection through the switch, from the reset generation it was opened in.
pub(crate) struct Link {
    /// The client's side.
    pub(crate) client: TcpStream,
    /// The server's side.
    pub(crate) server: TcpStream,
    /// A reset bumps the generation: every link of an older one ends.
    pub(crate) generation: u64,
}

impl Link {
    /// Connects `client` upstream once no partition holds (a partition answers no one: the
    /// server is not even reached until it ends). `None` when a reset came first (the client is
    /// reset and counted) or the server is down (the client sees its connection reset, as with
    /// no proxy in between).
    pub(crate) async fn open(switch: &FaultSwitch, client: TcpStream) -> Option<Link> {
        let mut faults = switch.faults.subscribe();
        let generation = faults.borrow().reset_generation;
        let _ = client.set_nodelay(true);
        if wait_open(&mut faults, generation).await.is_err() {
            switch.reset_one(&client);
            return None;
        }
        let connected = tokio::select! {
            c = TcpStream::connect(switch.upstream) => c,
            _ = reset_signal(faults.clone(), generation) => {
                switch.reset_one(&client);
                return None;
            }
        };
        let Ok(server) = connected else {
            abort(&client);
            return None;
        };
        let _ = server.set_nodelay(true);
        Some(Link {
            client,
            server,
            generation,
        })
    }

    /// The two sides, each split into its reading and writing half, for the pumps.
    pub(crate) fn split(&mut self) -> Halves<'_> {
        let (client_read, client_write) = self.client.split();
        let (server_read, server_write) = self.server.split();
        Halves {
            client_read,
            client_write,
            server_read,
            server_write,
        }
    }

    /// Ends the link as its pumps (see [`race`]) ended it: a reset resets both sides, and is
    /// counted.
    pub(crate) fn end(&self, switch: &FaultSwitch, end: End) {
        if end == End::Reset {
            switch.reset_one(&self.client);
            abort(&self.server);
        }
    }
}

/// Runs the two pumps of a link until one ends, or a reset of its `generation` ends both.
pub(crate) async fn race(
    switch: &FaultSwitch,
    generation: u64,
    up: impl Future<Output = End>,
    down: impl Future<Output = End>,
) -> End {
    tokio::select! {
        end = up => end,
        end = down => end,
        _ = reset_signal(switch.subscribe(), generation) => End::Reset,
    }
}

/// The two sides of a link, each split into its reading and writing half.
pub(crate) struct Halves<'a> {
    pub(crate) client_read: tokio::net::tcp::ReadHalf<'a>,
    pub(crate) client_write: tokio::net::tcp::WriteHalf<'a>,
    pub(crate) server_read: tokio::net::tcp::ReadHalf<'a>,
    pub(crate) server_write: tokio::net::tcp::WriteHalf<'a>,
}

/// Waits while a partition holds; `Err(End::Reset)` once the link's generation is reset or the
/// switch closes.
pub(crate) async fn wait_open(
    faults: &mut watch::Receiver<Faults>,
    generation: u64,
) -> Result<(), End> {
    loop {
        {
            let f = faults.borrow_and_update();
            if f.closed || f.reset_generation != generation {
                return Err(End::Reset);
            }
            if !f.blackhole {
                return Ok(());
            }
        }
        if faults.changed().await.is_err() {
            return Err(End::Reset);
        }
    }
}

/// Returns once the link's generation is reset or the switch closes.
async fn reset_signal(mut faults: watch::Receiver<Faults>, generation: u64) {
    loop {
        {
            let f = faults.borrow_and_update();
            if f.closed || f.reset_generation != generation {
                return;
            }
        }
        if faults.changed().await.is_err() {
            return;
        }
    }
}

/// What a pump's reader hands its writer: bytes to write once due, and a note for the moment
/// they are written.
pub(crate) type Due<T> = (Instant, Vec<u8>, T);

/// A pump's writer: writes what its reader sends, each once due and once no partition holds,
/// and calls `written` with its note after each; ends when the reader is gone, the other side
/// fails, or a reset comes.
pub(crate) async fn write_due<W, T>(
    mut to: W,
    mut rx: mpsc::UnboundedReceiver<Due<T>>,
    switch: &FaultSwitch,
    generation: u64,
    mut written: impl FnMut(T),
) -> End
where
    W: tokio::io::AsyncWrite + Unpin,
{
    let mut faults = switch.subscribe();
    while let Some((due, bytes, note)) = rx.recv().await {
        tokio::time::sleep_until(due).await;
        if let Err(end) = wait_open(&mut faults, generation).await {
            return end;
        }
        if to.write_all(&bytes).await.is_err() {
            return End::Closed;
        }
        written(note);
    }
    End::Closed
}

/// A pump: its reader and its writer together. When the reader ends with the close of its side,
/// the writer still delivers what was read before (the sender is gone with the reader).
pub(crate) async fn pump(
    reader: impl Future<Output = End>,
    writer: impl Future<Output = End>,
) -> End {
    tokio::pin!(reader, writer);
    tokio::select! {
        end = &mut reader => {
            if end == End::Closed {
                let _ = (&mut writer).await;
            }
            end
        }
        end = &mut writer => end,
    }
}
