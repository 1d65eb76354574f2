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

mod task;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot, watch};

use super::super::wire::keys::NOTIFY_PREFIX;
use super::breaks::Breaks;
use super::servers::Servers;

/// The longest a waiter sleeps between attempts while the hub has no live subscription.
pub(crate) const UNSUBSCRIBED_POLL: Duration = Duration::from_millis(500);

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
        runtime.spawn(task::run(
            servers,
            timeout,
            Arc::downgrade(&shared),
            rx,
            breaks,
        ));
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
