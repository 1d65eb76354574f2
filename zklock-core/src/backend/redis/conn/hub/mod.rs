//! Wake-ups for waiters: one pub/sub connection per backend (on Redis Cluster one per
//! primary), subscribed to the process's own channel `zklock:notify:<hub id>` (a mutex release
//! tells the first waiting process there, naming the lock) and to the channel of every
//! read/write lock or semaphore some local acquire waits for (their releases publish on the
//! lock's channel). The hub wakes that lock's local listeners.
//!
//! A Cluster delivers every message on every node, a bus hop later on the others (Redis sends
//! its bus without `TCP_NODELAY`: tens of milliseconds). So the hub listens on every primary
//! and takes a message only from the one that owns its lock's slot, which published it; a
//! message about a slot whose owner it does not listen on counts from any node (a duplicate
//! only wakes a waiter twice: a hand-over counts once, see `Acquire::handed_over`). A change
//! of the slot map wakes every listener, as a break does: a message may have been passed over.
//!
//! A waiter subscribes before its next attempt, so a release after that attempt is never
//! missed while the connection lives. When the pub/sub connection breaks, every listener is
//! woken (it may have missed a release), and the hub reconnects and subscribes again while
//! anyone listens; meanwhile waiters fall back to polling at [`UNSUBSCRIBED_POLL`]. A break
//! also counts in the backend's [`Breaks`]: held locks are unconfirmed until renewed.
//!
//! A mutex hold that may linger listens the same way, for the word that another process
//! queued for its lock (see `RedisHold::others_waiting`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use super::servers::Servers;
use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, oneshot, watch};

use super::super::wire::keys::NOTIFY_PREFIX;
use super::breaks::Breaks;
use crate::backend::backoff::Backoff;

/// The longest a waiter sleeps between attempts while the hub has no live subscription.
pub(crate) const UNSUBSCRIBED_POLL: Duration = Duration::from_millis(500);
/// The first pause before reconnecting a broken pub/sub connection; doubled up to
/// [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

struct Channel {
    listeners: usize,
    /// Subscribed on Redis by its own name (a broadcast channel); a mutex's listeners are
    /// woken through the hub's own channel instead.
    subscribed: bool,
    /// Counts wake-ups of this channel.
    wake: watch::Sender<u64>,
    /// Mutex holds a release handed to this process's waiters: holder id -> token. Taken by
    /// the waiter of that id; dropped with the channel's last listener.
    grants: HashMap<String, i64>,
}

enum Request {
    /// Subscribe to a channel (again: subscribing twice is harmless), or (`None`) only make
    /// sure the connection is up (it listens on the hub's own channel), and say whether it took.
    Subscribe(Option<String>, oneshot::Sender<bool>),
    /// A channel lost its last listener: unsubscribe unless someone listens again by now.
    Unsubscribe(String),
    /// The primary changed (a failover): drop the connection and open one to the new primary.
    Reconnect,
}

struct Shared {
    /// The hub's own channel, `zklock:notify:<hub id>`.
    notify: String,
    channels: StdMutex<HashMap<String, Channel>>,
    requests: mpsc::UnboundedSender<Request>,
    /// A pub/sub connection is up and subscribed to every channel with listeners (on Cluster,
    /// one or more: a primary without one is heard through the others, see
    /// [`Servers::first_hand`]).
    live: AtomicBool,
    /// Bumped whenever a broadcast channel gets its first listener: a connection opened in the
    /// background from a list of channels taken before subscribes them again if it changed.
    listened_version: AtomicU64,
    /// Bumped whenever every listener is woken (the connection opened or broke): a listener
    /// registered later than an event it waits for compares it (see [`Hub::listen_direct_after`]).
    generation: AtomicU64,
    /// Mutex hand-overs to a holder id of this process that no listener of that lock was
    /// registered for yet: holder id -> (channel, token). A waiter registers its listener
    /// only once refused (see [`Hub::listen_direct_after`]), so a release may hand it the lock
    /// first. Bounded by [`MAX_ORPHANS`]; locked after `channels`.
    orphans: StdMutex<HashMap<String, (String, i64)>>,
}

/// The most hand-overs kept for listeners yet to register. A hand-over dropped past it (or to
/// an acquire given up on) is not lost for the lock: the waiter finds the key its own at its
/// next attempt (every waiter TTL/3 at the latest), and an abandoned one ends with its first
/// lease.
const MAX_ORPHANS: usize = 256;

impl Shared {
    fn wake_all(&self) {
        self.generation.fetch_add(1, Ordering::SeqCst);
        for channel in self.channels.lock().unwrap().values() {
            channel.wake.send_modify(|n| *n += 1);
        }
    }

    fn wake(&self, name: &str) {
        if let Some(channel) = self.channels.lock().unwrap().get(name) {
            channel.wake.send_modify(|n| *n += 1);
        }
    }

    /// A message on the hub's own channel: `<wake channel>\n<token>\n<holder id>`, a mutex
    /// handed to that holder (see `scripts::RELEASE_MUTEX`); or a bare channel name: a mutex's
    /// queue name, when a first waiter queues for a lock this process holds (see
    /// `scripts::ACQUIRE_MUTEX`), which wakes that hold's listener if it has one.
    fn notified(&self, payload: &str) {
        let mut parts = payload.splitn(3, '\n');
        let name = parts.next().unwrap_or_default();
        let mut channels = self.channels.lock().unwrap();
        let grant = match (parts.next(), parts.next()) {
            (Some(token), Some(id)) => token.parse::<i64>().ok().map(|t| (id, t)),
            _ => None,
        };
        let Some(channel) = channels.get_mut(name) else {
            // A hand-over to a waiter that has not registered its listener yet.
            if let Some((id, token)) = grant {
                let mut orphans = self.orphans.lock().unwrap();
                if orphans.len() >= MAX_ORPHANS {
                    orphans.clear();
                }
                orphans.insert(id.to_string(), (name.to_string(), token));
            }
            return;
        };
        if let Some((id, token)) = grant {
            channel.grants.insert(id.to_string(), token);
        }
        channel.wake.send_modify(|n| *n += 1);
    }

    /// What a (new) pub/sub connection subscribes to: the hub's own channel, and every
    /// broadcast channel with listeners.
    fn listened(&self) -> Vec<String> {
        let channels = self.channels.lock().unwrap();
        std::iter::once(self.notify.clone())
            .chain(
                channels
                    .iter()
                    .filter(|(_, c)| c.subscribed)
                    .map(|(name, _)| name.clone()),
            )
            .collect()
    }
}

/// The wake-up hub of one backend. Its task ends when the hub and its last listener are
/// dropped (its request channel closes then).
pub(crate) struct Hub {
    shared: Arc<Shared>,
    /// Names this process's channel; the first word of its mutex queue members.
    pub(crate) id: String,
}

impl Hub {
    /// Starts the hub's task on `runtime`; each break of its connection counts in `breaks`.
    pub(crate) fn start(
        servers: Servers,
        timeout: Duration,
        runtime: &tokio::runtime::Handle,
        breaks: Breaks,
    ) -> Hub {
        let (tx, rx) = mpsc::unbounded_channel();
        let id = uuid::Uuid::new_v4().to_string();
        let shared = Arc::new(Shared {
            notify: format!("{NOTIFY_PREFIX}{id}"),
            channels: StdMutex::new(HashMap::new()),
            requests: tx,
            live: AtomicBool::new(false),
            listened_version: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            orphans: StdMutex::new(HashMap::new()),
        });
        runtime.spawn(run(servers, timeout, Arc::downgrade(&shared), rx, breaks));
        Hub { shared, id }
    }

    /// The primary changed: the hub drops its connection (a break) and opens one to the new
    /// primary.
    pub(crate) fn reconnect(&self) {
        let _ = self.shared.requests.send(Request::Reconnect);
    }

    /// Starts listening on `channel` and waits (at most `timeout`) until the subscription is
    /// confirmed: releases published from then on wake the listener. `direct`: the wake-ups
    /// come through the hub's own channel (a mutex's queue), not by subscribing to `channel`.
    ///
    /// `id`: the holder id of a mutex waiter, to which a release may hand the lock (see
    /// [`Listener::take_grant`]).
    pub(crate) async fn listen(
        &self,
        channel: &str,
        direct: bool,
        id: Option<&str>,
        timeout: Duration,
    ) -> Listener {
        let listener = self.register(channel, direct, id);
        self.subscribe((!direct).then(|| channel.to_string()), timeout)
            .await;
        listener
    }

    /// Asks the hub's task to subscribe to `channel` (`None`: only to have the connection up,
    /// which listens on the hub's own channel), and waits at most `timeout` for it: whether it
    /// took.
    async fn subscribe(&self, channel: Option<String>, timeout: Duration) -> bool {
        let (tx, rx) = oneshot::channel();
        if self
            .shared
            .requests
            .send(Request::Subscribe(channel, tx))
            .is_err()
        {
            return false;
        }
        matches!(tokio::time::timeout(timeout, rx).await, Ok(Ok(true)))
    }

    /// The hub's generation: read it before an attempt whose refusal may register a listener
    /// with [`listen_direct_after`](Self::listen_direct_after).
    pub(crate) fn generation(&self) -> u64 {
        self.shared.generation.load(Ordering::SeqCst)
    }

    /// A refused mutex waiter's listener (woken through the hub's own channel), at once and
    /// without a word to the hub's task, if the hub's connection is live (so its own channel is
    /// subscribed); else `None` (then [`listen`](Self::listen)). It takes a hand-over to `id`
    /// that came before it (kept by the hub), and it is woken at once if that came, or if the
    /// connection opened or broke since `generation` (read before the attempt: a word may have
    /// been lost), so that nothing since the attempt goes unseen. An acquire pays for it only
    /// once refused.
    pub(crate) fn listen_direct_after(
        &self,
        channel: &str,
        id: &str,
        generation: u64,
    ) -> Option<Listener> {
        // Registered before looking: a connection that breaks from here wakes it.
        let mut listener = self.register(channel, true, Some(id));
        if !self.shared.live.load(Ordering::SeqCst) {
            return None;
        }
        let handed = {
            let mut channels = self.shared.channels.lock().unwrap();
            let orphan = self.shared.orphans.lock().unwrap().remove(id);
            match (orphan, channels.get_mut(channel)) {
                (Some((on, token)), Some(entry)) if on == channel => {
                    entry.grants.insert(id.to_string(), token);
                    true
                }
                _ => false,
            }
        };
        if handed || self.generation() != generation {
            listener.wake.mark_changed();
        }
        Some(listener)
    }

    /// Listens for wake-ups of `channel` that come through the hub's own channel (the word a
    /// first waiter sends a mutex's holder, see `scripts::ACQUIRE_MUTEX`), once the hub's
    /// connection is up (waiting at most `timeout` for it). Every wake-up before the
    /// connection was known to be live is marked seen; `None` if it is not live. From then on
    /// a message for `channel`, or any break of the connection (which may have lost one),
    /// wakes the listener.
    pub(crate) async fn listen_live(&self, channel: &str, timeout: Duration) -> Option<Listener> {
        let mut listener = self.register(channel, true, None);
        let took = self.subscribe(None, timeout).await;
        // After the connection's own wake-up: a break from here on wakes the listener again,
        // and one before shows in `live`.
        listener.mark();
        (took && self.shared.live.load(Ordering::SeqCst)).then_some(listener)
    }

    /// Registers a listener of `channel` (cancelling it, by drop, stops listening).
    fn register(&self, channel: &str, direct: bool, id: Option<&str>) -> Listener {
        let wake = {
            let mut channels = self.shared.channels.lock().unwrap();
            let entry = channels
                .entry(channel.to_string())
                .or_insert_with(|| Channel {
                    listeners: 0,
                    subscribed: false,
                    wake: watch::channel(0).0,
                    grants: HashMap::new(),
                });
            entry.listeners += 1;
            if !direct && !entry.subscribed {
                entry.subscribed = true;
                self.shared.listened_version.fetch_add(1, Ordering::SeqCst);
            }
            entry.wake.subscribe()
        };
        Listener {
            shared: self.shared.clone(),
            channel: channel.to_string(),
            wake,
            id: id.map(str::to_string),
        }
    }
}

/// One waiter's interest in a channel.
pub(crate) struct Listener {
    shared: Arc<Shared>,
    channel: String,
    wake: watch::Receiver<u64>,
    /// The mutex waiter's holder id, if a release may hand it the lock.
    id: Option<String>,
}

impl Listener {
    /// The token of the mutex hold a release handed to this waiter, if one did (once).
    pub(crate) fn take_grant(&self) -> Option<i64> {
        let id = self.id.as_ref()?;
        let mut channels = self.shared.channels.lock().unwrap();
        channels.get_mut(&self.channel)?.grants.remove(id)
    }

    /// Marks every wake-up so far as seen: call it before an attempt, then
    /// [`wait`](Self::wait) wakes for any release after it.
    pub(crate) fn mark(&mut self) {
        self.wake.borrow_and_update();
    }

    /// Whether a wake-up came since the last [`mark`](Self::mark).
    pub(crate) fn woken(&self) -> bool {
        self.wake.has_changed().unwrap_or(true)
    }

    /// Waits for a wake-up since the last [`mark`](Self::mark), however long it takes.
    pub(crate) async fn wake_up(&mut self) {
        let _ = self.wake.changed().await;
    }

    /// Waits for a wake-up since the last [`mark`](Self::mark), or `fallback`, whichever
    /// comes first; at most [`UNSUBSCRIBED_POLL`] while the subscription is not live.
    pub(crate) async fn wait(&mut self, fallback: Duration) {
        let fallback = if self.shared.live.load(Ordering::SeqCst) {
            fallback
        } else {
            fallback.min(UNSUBSCRIBED_POLL)
        };
        let _ = tokio::time::timeout(fallback, self.wake.changed()).await;
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut channels = self.shared.channels.lock().unwrap();
        let (last, subscribed) = match channels.get_mut(&self.channel) {
            Some(c) => {
                if let Some(id) = &self.id {
                    c.grants.remove(id);
                }
                c.listeners -= 1;
                (c.listeners == 0, c.subscribed)
            }
            None => (false, false),
        };
        if last {
            channels.remove(&self.channel);
        }
        if last && subscribed {
            drop(channels);
            let _ = self
                .shared
                .requests
                .send(Request::Unsubscribe(self.channel.clone()));
        }
    }
}

/// The hub's task: owns the pub/sub connections, serves (un)subscribe requests in order, and
/// dispatches messages.
async fn run(
    servers: Servers,
    timeout: Duration,
    shared: Weak<Shared>,
    requests: mpsc::UnboundedReceiver<Request>,
    breaks: Breaks,
) {
    let (opened_tx, opened) = mpsc::unbounded_channel();
    let mut task = HubTask {
        map: servers.map_changes(),
        servers,
        timeout,
        shared,
        requests,
        breaks,
        subs: Vec::new(),
        complete: false,
        opening: false,
        opened,
        opened_tx,
        backoff: Backoff::new(RECONNECT_MIN, RECONNECT_MAX),
    };
    loop {
        let Some(hub) = task.shared.upgrade() else {
            return;
        };
        let reconnect = !task.complete && !task.opening && !hub.channels.lock().unwrap().is_empty();
        drop(hub);
        let Some(event) = task.next_event(reconnect).await else {
            return;
        };
        let Some(hub) = task.shared.upgrade() else {
            return;
        };
        match event {
            Event::Request(Request::Subscribe(channel, done)) => {
                let ok = task.subscribe(&hub, channel).await;
                let _ = done.send(ok);
            }
            Event::Request(Request::Unsubscribe(channel)) => task.unsubscribe(&hub, channel).await,
            Event::Request(Request::Reconnect) => {
                if !task.subs.is_empty() {
                    let nodes: Vec<_> = task.subs.drain(..).map(|s| s.node).collect();
                    task.recheck(&hub);
                    task.broke(&hub, &nodes);
                    task.connect_now(&hub).await;
                }
            }
            Event::Message(i, message) => task.dispatch(&hub, i, message),
            Event::MapChanged => task.map_changed(&hub).await,
            Event::Reconnect => task.open_missing(&hub).await,
            Event::Opened(opened, version) => task.opened(&hub, opened, version).await,
        }
    }
}

/// What the hub's task has to act on next.
enum Event {
    /// A listener's (un)subscribe request.
    Request(Request),
    /// A message on the `i`th pub/sub connection, or (`None`) its end.
    Message(usize, Option<redis::Msg>),
    /// The Cluster's slot map changed: the primaries to listen on may be others.
    MapChanged,
    /// Someone listens while a connection is missing, and the pause before reconnecting ran
    /// out.
    Reconnect,
    /// Connections opened in the background, subscribed to the channels listened at
    /// `version` of [`Shared::listened_version`].
    Opened(Vec<Sub>, u64),
}

/// One pub/sub connection: to the one server or the Sentinels' primary (`node` `None`), or to
/// one Cluster primary.
struct Sub {
    node: Option<(String, u16)>,
    sink: PubSubSink,
    stream: PubSubStream,
}

/// The hub's task's own state: its pub/sub connections (none while they are down and nobody
/// listens, or until they reconnect) and the pause before its next reconnect. It holds its hub
/// weakly: it ends once the hub is gone.
///
/// It never waits on a server it has no connection to while it has some: a missing
/// connection (a Cluster primary down or cut off) is opened by a task of its own, so that the
/// others' messages and the listeners' requests go on meanwhile.
struct HubTask {
    servers: Servers,
    timeout: Duration,
    shared: Weak<Shared>,
    requests: mpsc::UnboundedReceiver<Request>,
    /// Counts each break of a connection, for the backend's holds.
    breaks: Breaks,
    /// One connection, or on Cluster one per primary (each hears every message; the hub takes
    /// each from the primary that published it, see [`Servers::first_hand`]).
    subs: Vec<Sub>,
    /// On Cluster, the slot map's changes.
    map: Option<watch::Receiver<u64>>,
    /// Whether a connection is open to every server the hub listens on: set by
    /// [`recheck`](Self::recheck) whenever the connections or the slot map change.
    complete: bool,
    /// Missing connections are being opened in the background.
    opening: bool,
    /// Where the background opening reports.
    opened: mpsc::UnboundedReceiver<(Vec<Sub>, u64)>,
    opened_tx: mpsc::UnboundedSender<(Vec<Sub>, u64)>,
    backoff: Backoff,
}

impl HubTask {
    /// Finds out again whether a connection is open to every server the hub listens on, and
    /// whether the hub is live (it has a connection: on Cluster the others are heard through
    /// it, see [`Servers::first_hand`]).
    fn recheck(&mut self, hub: &Shared) -> bool {
        let nodes: Vec<_> = self.subs.iter().map(|s| s.node.clone()).collect();
        self.complete = self.servers.covered_by(&nodes);
        hub.live.store(!self.subs.is_empty(), Ordering::SeqCst);
        self.complete
    }

    /// Waits for a request, a message, a change of the slot map, connections opened in the
    /// background, or (when `reconnect`) the end of the pause before reconnecting, whichever
    /// comes first. `None` once the hub and every listener are gone (the request channel
    /// closed).
    async fn next_event(&mut self, reconnect: bool) -> Option<Event> {
        let subs = &mut self.subs;
        let next_message = futures::future::poll_fn(|cx| {
            for (i, sub) in subs.iter_mut().enumerate() {
                if let std::task::Poll::Ready(message) = sub.stream.poll_next_unpin(cx) {
                    return std::task::Poll::Ready((i, message));
                }
            }
            std::task::Poll::Pending
        });
        let map = &mut self.map;
        let map_changed = async {
            match map {
                Some(changes) => {
                    if changes.changed().await.is_err() {
                        *map = None;
                    }
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            request = self.requests.recv() => request.map(Event::Request),
            (i, message) = next_message => Some(Event::Message(i, message)),
            () = map_changed => Some(Event::MapChanged),
            Some((opened, version)) = self.opened.recv() => Some(Event::Opened(opened, version)),
            // While someone listens without every connection, reconnect with a growing pause.
            _ = tokio::time::sleep(self.backoff.peek()), if reconnect => Some(Event::Reconnect),
        }
    }

    /// Subscribes every connection to `channel` (`None`: the hub's own channel, subscribed
    /// with each connection): whether it took on one at least (on Cluster the others' messages
    /// come through it). With no connection at all, they are opened first (nothing else is
    /// waiting then); missing ones beside open ones are opened in the background. A subscribe
    /// that fails or times out counts as a break of its connection.
    async fn subscribe(&mut self, hub: &Shared, channel: Option<String>) -> bool {
        let open_before = if self.subs.is_empty() {
            self.connect_now(hub).await;
            0
        } else {
            if !self.complete {
                self.open_missing(hub).await;
            }
            self.subs.len()
        };
        let Some(channel) = channel else {
            return !self.subs.is_empty();
        };
        // The connections just opened subscribed to every listened channel already.
        let channels = std::slice::from_ref(&channel);
        let took = send_each(
            &mut self.subs[..open_before],
            self.timeout,
            Command::Subscribe,
            channels,
        )
        .await;
        self.drop_failed(hub, &took);
        !self.subs.is_empty()
    }

    /// Unsubscribes every connection from `channel`, unless someone listens to it again by
    /// now. An unsubscribe that fails or times out counts as a break of its connection.
    async fn unsubscribe(&mut self, hub: &Shared, channel: String) {
        if hub.channels.lock().unwrap().contains_key(&channel) {
            return;
        }
        let channels = std::slice::from_ref(&channel);
        let took = send_each(&mut self.subs, self.timeout, Command::Unsubscribe, channels).await;
        self.drop_failed(hub, &took);
    }

    /// Drops the connections whose request did not take (`took[i]` false for the `i`th), a
    /// break if any: whether all took.
    fn drop_failed(&mut self, hub: &Shared, took: &[bool]) -> bool {
        if took.iter().all(|&t| t) {
            return true;
        }
        let mut failed = Vec::new();
        let mut took = took.iter();
        self.subs.retain(|sub| {
            let keep = took.next().copied().unwrap_or(true);
            if !keep {
                failed.push(sub.node.clone());
            }
            keep
        });
        self.recheck(hub);
        self.broke(hub, &failed);
        false
    }

    /// Hands a message on the `i`th connection to the hub: one on its own channel is read
    /// there, one on a lock's channel wakes that lock's listeners; on Cluster only from the
    /// primary that owns the lock's slot, which published it (see [`Servers::first_hand`]).
    /// The end of the stream is a break of that connection.
    fn dispatch(&mut self, hub: &Shared, i: usize, message: Option<redis::Msg>) {
        let Some(message) = message else {
            tracing::debug!(
                "zklock: a Redis pub/sub connection broke; waiters poll until it is back"
            );
            let node = self.subs.swap_remove(i).node;
            self.recheck(hub);
            self.broke(hub, &[node]);
            return;
        };
        let first_hand = |key: &str| {
            self.servers.first_hand(
                self.subs[i].node.as_ref(),
                key,
                self.subs.iter().map(|s| s.node.as_ref()),
            )
        };
        let channel = message.get_channel_name();
        if channel == hub.notify {
            if let Ok(payload) = message.get_payload::<String>() {
                // The first line names the lock's channel or queue: a key of its slot.
                let about = payload.split('\n').next().unwrap_or_default();
                if first_hand(about) {
                    hub.notified(&payload);
                }
            }
        } else if first_hand(channel) {
            hub.wake(channel);
        }
    }

    /// The Cluster's slot map changed: connections to nodes no longer primaries are closed,
    /// missing ones opened in the background (if the hub listens at all), and every listener
    /// woken: a message may have been passed over as not first-hand under the old map.
    async fn map_changed(&mut self, hub: &Shared) {
        let primaries = self.servers.listened_nodes();
        let listening = !self.subs.is_empty();
        self.subs.retain(|s| primaries.contains(&s.node));
        self.recheck(hub);
        hub.wake_all();
        if listening {
            self.open_missing(hub).await;
        }
    }

    /// The servers the hub listens on and has no connection to.
    fn missing(&self) -> Vec<Option<(String, u16)>> {
        self.servers
            .listened_nodes()
            .into_iter()
            .filter(|n| !self.subs.iter().any(|s| s.node == *n))
            .collect()
    }

    /// Opens the missing connections here and now (when the hub has none: nothing else waits
    /// on it meanwhile), each subscribed to every listened channel: every listener is woken if
    /// one opened (it may have missed a release meanwhile).
    async fn connect_now(&mut self, hub: &Shared) {
        let missing = self.missing();
        let channels = hub.listened();
        let version = hub.listened_version.load(Ordering::SeqCst);
        let opened = open_all(&self.servers, self.timeout, &channels, missing).await;
        self.opened(hub, opened, version).await;
    }

    /// Starts opening the missing connections in a task of its own (unless one is at it),
    /// which reports as [`Event::Opened`].
    async fn open_missing(&mut self, hub: &Shared) {
        if self.opening {
            return;
        }
        let missing = self.missing();
        if missing.is_empty() {
            self.recheck(hub);
            return;
        }
        self.opening = true;
        let (servers, timeout, tx) = (self.servers.clone(), self.timeout, self.opened_tx.clone());
        let channels = hub.listened();
        let version = hub.listened_version.load(Ordering::SeqCst);
        tokio::spawn(async move {
            let opened = open_all(&servers, timeout, &channels, missing).await;
            let _ = tx.send((opened, version));
        });
    }

    /// Connections were opened, subscribed to the channels listened at `version`: each is
    /// subscribed to every channel listened now if that changed since, kept unless the hub
    /// has one to its server already; every listener is woken if one was kept. The pause
    /// before the next reconnect doubles (up to [`RECONNECT_MAX`]) while some stay missing,
    /// and starts over once none is.
    async fn opened(&mut self, hub: &Shared, mut opened: Vec<Sub>, version: u64) {
        self.opening = false;
        let wanted = self.servers.listened_nodes();
        opened.retain(|o| wanted.contains(&o.node) && !self.subs.iter().any(|s| s.node == o.node));
        if hub.listened_version.load(Ordering::SeqCst) != version {
            let channels = hub.listened();
            let took = send_each(&mut opened, self.timeout, Command::Subscribe, &channels).await;
            let mut took = took.into_iter();
            opened.retain(|_| took.next().unwrap_or(false));
        }
        let any = !opened.is_empty();
        self.subs.extend(opened);
        let complete = self.recheck(hub);
        if any {
            hub.wake_all();
        }
        if complete {
            self.backoff.reset();
        } else {
            self.backoff.take();
        }
    }

    /// The connections to `nodes` broke (or are given up; the caller dropped them): the break
    /// counted in the backend's [`Breaks`] for the holds it reaches (on Cluster, those in the
    /// nodes' slots: a lingering hold there may have missed the word that someone waits), and
    /// every listener woken (it may have missed a release).
    fn broke(&mut self, hub: &Shared, nodes: &[Option<(String, u16)>]) {
        let mut slots = Some(Vec::new());
        for node in nodes {
            match (self.servers.slots_of(node), &mut slots) {
                (Some(of_node), Some(all)) => all.extend(of_node),
                _ => slots = None,
            }
        }
        self.breaks.broke(slots.as_deref());
        hub.wake_all();
    }
}

/// What [`send_each`] sends.
#[derive(Clone, Copy)]
enum Command {
    Subscribe,
    Unsubscribe,
}

/// Sends `SUBSCRIBE` (or `UNSUBSCRIBE`) for `channels` on each of `subs` at once, each bounded
/// by `timeout`: whether each took.
async fn send_each(
    subs: &mut [Sub],
    timeout: Duration,
    command: Command,
    channels: &[String],
) -> Vec<bool> {
    futures::future::join_all(subs.iter_mut().map(|sub| async move {
        let sent = async {
            match command {
                Command::Subscribe => sub.sink.subscribe(channels).await,
                Command::Unsubscribe => sub.sink.unsubscribe(channels).await,
            }
        };
        matches!(tokio::time::timeout(timeout, sent).await, Ok(Ok(())))
    }))
    .await
}

/// Opens a connection to each of `nodes`, each subscribed to `channels`: those that opened.
async fn open_all(
    servers: &Servers,
    timeout: Duration,
    channels: &[String],
    nodes: Vec<Option<(String, u16)>>,
) -> Vec<Sub> {
    futures::future::join_all(
        nodes
            .into_iter()
            .map(|node| connect(servers, timeout, channels, node)),
    )
    .await
    .into_iter()
    .flatten()
    .collect()
}

/// Opens a pub/sub connection to `node` (`None`: the one server, or the Sentinels' primary)
/// and subscribes it to `channels`.
async fn connect(
    servers: &Servers,
    timeout: Duration,
    channels: &[String],
    node: Option<(String, u16)>,
) -> Option<Sub> {
    let opened = tokio::time::timeout(timeout, async {
        let client = match &node {
            Some((host, port)) => servers.node_client(host, *port)?,
            None => servers.client(timeout).await?.0,
        };
        let (mut sink, stream) = servers.dial().pubsub(&client).await?.split();
        sink.subscribe(channels).await?;
        Ok::<_, redis::RedisError>((sink, stream))
    })
    .await;
    match opened {
        Ok(Ok((sink, stream))) => Some(Sub { node, sink, stream }),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "zklock: cannot open the Redis pub/sub connection");
            None
        }
        Err(_) => {
            tracing::debug!("zklock: the Redis pub/sub connection did not open in time");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hub whose connection counts as live, with no server behind it: what the listeners'
    /// bookkeeping does, apart from the wire.
    fn live_hub() -> Hub {
        let client = redis::Client::open("redis://127.0.0.1:1/").expect("a URL");
        let hub = Hub::start(
            Servers::One(
                Box::new(client),
                crate::backend::redis::conn::dial::Dial::default(),
            ),
            Duration::from_millis(50),
            &tokio::runtime::Handle::current(),
            Breaks::new(),
        );
        hub.shared.live.store(true, Ordering::SeqCst);
        hub
    }

    #[tokio::test]
    async fn a_hand_over_before_the_waiter_listens_is_kept_for_it() {
        let hub = live_hub();
        let generation = hub.generation();
        // The release's word comes between the refusal and the listener.
        hub.shared.notified("zklock:wake:/a\n42\nid-1");
        let listener = hub
            .listen_direct_after("zklock:wake:/a", "id-1", generation)
            .expect("live");
        assert!(
            listener.woken(),
            "the waiter must not wait for a word it had"
        );
        assert_eq!(listener.take_grant(), Some(42));
        assert!(hub.shared.orphans.lock().unwrap().is_empty());
        // Another waiter's hand-over is not this one's.
        hub.shared.notified("zklock:wake:/b\n43\nid-2");
        let other = hub
            .listen_direct_after("zklock:wake:/b", "id-3", generation)
            .expect("live");
        assert!(!other.woken());
        assert_eq!(other.take_grant(), None);
    }

    #[tokio::test]
    async fn a_connection_event_since_the_attempt_wakes_a_late_listener() {
        let hub = live_hub();
        let generation = hub.generation();
        hub.shared.wake_all();
        let listener = hub
            .listen_direct_after("zklock:wake:/a", "id-1", generation)
            .expect("live");
        assert!(listener.woken());
        let quiet = hub
            .listen_direct_after("zklock:wake:/c", "id-2", hub.generation())
            .expect("live");
        assert!(!quiet.woken());
    }

    #[tokio::test]
    async fn orphaned_hand_overs_stay_bounded() {
        let hub = live_hub();
        for i in 0..3 * MAX_ORPHANS {
            hub.shared.notified(&format!("zklock:wake:/a\n{i}\nid-{i}"));
        }
        assert!(hub.shared.orphans.lock().unwrap().len() <= MAX_ORPHANS);
    }
}
