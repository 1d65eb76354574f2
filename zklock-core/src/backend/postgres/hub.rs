//! Waking waiters: one connection per backend `LISTEN`s on [`wire::CHANNEL`], which a release
//! notifies with the lock id when someone waits for it; a waiter sleeps until its id is
//! notified (or its fallback pause passes: a holder whose session ended released without
//! notifying).
//!
//! A release notifies only if some process registered a waiter for the id: the listening
//! connection holds the shared lock `(WAIT_CLASS, id)` while any task of this backend waits
//! for `id` (see the module docs of [`wire`]). A waiter has its registration confirmed before
//! its next attempt ([`Listener::registered`]), so a release that follows that attempt sees it.
//!
//! Waits in the server's lock queue ([`Hub::queued`]) need no wake-up (the server grants
//! them), but holders must still learn of them: the listening connection registers them too,
//! in a class of their own that releases do not look at, once a wait lasted a few ms, and
//! keeps the registration a moment after the last one ended, so that a process that waits for a
//! key again and again registers (and notifies the holders) once.
//!
//! Waiters hold no connection while they wait; the server keeps one lock per id waited for.
//! When the listening connection breaks, its registrations end with it: the hub connects
//! again, listens, registers every id still waited for, and only then wakes every waiter (each
//! may have missed a release).
//!
//! The listening connection is a session like the holding ones: it runs with
//! `idle_session_timeout` = the lease and answers a liveness check every lease/3. Without that,
//! a process cut off without a FIN (a partition, a host that died) would leave its listening
//! session on the server for good, PostgreSQL noticing a dead peer only by TCP keepalive (off
//! by default for hours): its waiter registrations held for ever (every release of those ids
//! notifies, every holder of them believes someone waits), and a listener that never reads
//! pinning the server's notification queue, which then fills until `NOTIFY` fails for every
//! process. The check also tells this side within the lease that its listening connection went
//! silent, so it connects again (and holders learn that they may have missed a waiter).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::time::Instant;

use futures::StreamExt;
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::{AbortHandle, JoinHandle};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client};

use super::conn::ConnConfig;
use super::wire;
use crate::backend::BoxFuture;

/// What the waiters of one lock id share.
struct Entry {
    /// A counter bumped by each release notified.
    wake: watch::Sender<u64>,
    /// Whether the listening connection holds the registration for the id.
    registered: watch::Sender<bool>,
}

/// The waits of one lock id in the server's queue (see [`Hub::queued`]).
struct QueuedEntry {
    /// How many wait now.
    count: usize,
    /// When the last one ended, while none does.
    idle_since: Option<Instant>,
}

impl QueuedEntry {
    /// Whether the registration is wanted at `now`: while some wait, and for
    /// [`QUEUE_LINGER`] after.
    fn wanted(&self, now: Instant) -> bool {
        self.count > 0 || self.idle_since.is_some_and(|t| now < t + QUEUE_LINGER)
    }
}

/// An id whose registration may need to change: of waiters retrying, or of waits in the
/// server's queue.
#[derive(Clone, Copy, Debug)]
enum Registration {
    Wait(i32),
    Queue(i32),
}

/// What the hub's task is asked to do: look at one registration, or flush (answered once
/// every registration that nobody wants any more, lingering ones included, has ended).
#[derive(Debug)]
enum Order {
    Register(Registration),
    Flush(oneshot::Sender<()>),
}

/// The ids waited for, and the hub task's orders.
struct Shared {
    entries: StdMutex<HashMap<i32, Entry>>,
    /// The ids waited for in the server's queue.
    queued: StdMutex<HashMap<i32, QueuedEntry>>,
    orders: mpsc::UnboundedSender<Order>,
    /// Per lock id held or tried here, a counter bumped by each registration of a waiter
    /// notified (by any process), and how many [`WaiterWatch`]es read it (the entry goes with
    /// the last): what tells a holder that another contender appeared.
    appeared: StdMutex<HashMap<i32, Appeared>>,
    /// Notified (all of its waiters) whenever a counter of `appeared` is bumped: a holder
    /// waiting for a contender looks at its own counter again.
    bumped: Notify,
    /// Bumped each time the listening connection starts or stops listening; odd while it
    /// listens. A holder that saw it change may have missed a registration.
    listening: watch::Sender<u64>,
}

impl Shared {
    fn entries(&self) -> std::sync::MutexGuard<'_, HashMap<i32, Entry>> {
        self.entries.lock().expect("not poisoned")
    }

    /// Tells the holders of `id` that a waiter registered.
    fn appeared(&self, id: i32) {
        if let Some(a) = self.appeared.lock().expect("not poisoned").get_mut(&id) {
            a.count += 1;
            self.bumped.notify_waiters();
        }
    }

    /// The counter of `id` (`None`: no watch reads it).
    fn appeared_count(&self, id: i32) -> Option<u64> {
        self.appeared
            .lock()
            .expect("not poisoned")
            .get(&id)
            .map(|a| a.count)
    }

    /// Wakes the waiters of `id`, or of every id.
    fn wake(&self, id: Option<i32>) {
        let entries = self.entries();
        match id {
            Some(id) => {
                if let Some(e) = entries.get(&id) {
                    e.wake.send_modify(|n| *n += 1);
                }
            }
            None => entries
                .values()
                .for_each(|e| e.wake.send_modify(|n| *n += 1)),
        }
    }
}

/// The pause before connecting the listener again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);
/// How long a registration of waits in the server's queue is kept after the last one ended
/// (it is ended at the next liveness check after that): a process that waits for a key again
/// and again registers once, and tells the holders once.
const QUEUE_LINGER: Duration = Duration::from_millis(500);

pub(super) struct Hub {
    shared: Arc<Shared>,
    task: AbortHandle,
}

impl Hub {
    /// Starts listening (in the background: waiters poll until it listens).
    pub(super) fn start(cc: Arc<ConnConfig>) -> Hub {
        let (orders, rx) = mpsc::unbounded_channel();
        let shared = Arc::new(Shared {
            entries: StdMutex::default(),
            queued: StdMutex::default(),
            orders,
            appeared: StdMutex::default(),
            bumped: Notify::new(),
            listening: watch::channel(0).0,
        });
        let task = cc
            .runtime
            .spawn(run(cc.clone(), shared.clone(), rx))
            .abort_handle();
        Hub { shared, task }
    }

    /// Starts listening for releases of `id`, and registers this backend as waiting for it
    /// (confirmed by [`Listener::registered`]).
    pub(super) fn listen(&self, id: i32) -> Listener {
        let mut entries = self.shared.entries();
        let entry = entries.entry(id).or_insert_with(|| Entry {
            wake: watch::channel(0).0,
            registered: watch::channel(false).0,
        });
        let listener = Listener {
            wake: entry.wake.subscribe(),
            registered: entry.registered.subscribe(),
            id,
            shared: self.shared.clone(),
        };
        if !*entry.registered.borrow() {
            let _ = self
                .shared
                .orders
                .send(Order::Register(Registration::Wait(id)));
        }
        listener
    }

    /// Registers a wait of this backend in the server's queue for `id`, until the guard is
    /// dropped (and [`QUEUE_LINGER`] after): holders learn of it as of a waiter's (a lingering
    /// hold gives the lock up, local handoffs are bounded), but releases do not notify for it,
    /// since the server hands the lock to it. The registration is made in the background; the
    /// wait does not wait for it (a holder granted before it lands hears of it by
    /// notification).
    pub(super) fn queued(&self, id: i32) -> Queued {
        let mut queued = self.shared.queued.lock().expect("not poisoned");
        let entry = queued.entry(id).or_insert(QueuedEntry {
            count: 0,
            idle_since: None,
        });
        entry.count += 1;
        let fresh = entry.count == 1 && entry.idle_since.is_none();
        entry.idle_since = None;
        if fresh {
            let _ = self
                .shared
                .orders
                .send(Order::Register(Registration::Queue(id)));
        }
        Queued {
            id,
            shared: self.shared.clone(),
        }
    }
}

impl Hub {
    /// Waits until the listening connection holds no registration that nobody wants: those
    /// of waiters that gave up (ended in the background) and those of waits in the server's
    /// queue that ended (kept for [`QUEUE_LINGER`] otherwise). While the connection is down
    /// it holds none.
    pub(super) async fn flush(&self) {
        let (done, flushed) = oneshot::channel();
        if self.shared.orders.send(Order::Flush(done)).is_ok() {
            // Dropped unanswered only with the hub's task: then nothing is registered.
            let _ = flushed.await;
        }
    }
}

/// A wait in the server's queue, registered: see [`Hub::queued`].
pub(super) struct Queued {
    id: i32,
    shared: Arc<Shared>,
}

impl Drop for Queued {
    fn drop(&mut self) {
        let mut queued = self.shared.queued.lock().expect("not poisoned");
        if let Some(e) = queued.get_mut(&self.id) {
            e.count -= 1;
            if e.count == 0 {
                e.idle_since = Some(Instant::now());
            }
        }
    }
}

impl Hub {
    /// Starts watching for waiters of `id` registering (in any process): call before the
    /// attempt that may take the lock, so none registering after it is missed.
    pub(super) fn watch_waiters(&self, id: i32) -> WaiterWatch {
        let start = {
            let mut appeared = self.shared.appeared.lock().expect("not poisoned");
            let a = appeared.entry(id).or_default();
            a.watchers += 1;
            a.count
        };
        let listening = self.shared.listening.subscribe();
        let listened = *listening.borrow() % 2 == 1;
        WaiterWatch {
            start,
            listening,
            listened,
            id,
            shared: self.shared.clone(),
        }
    }
}

/// A holder's watch for other contenders of its lock id: see [`Hub::watch_waiters`].
pub(super) struct WaiterWatch {
    /// The id's counter of registrations when the watch started.
    start: u64,
    listening: watch::Receiver<u64>,
    /// The listening connection listened when the watch started.
    listened: bool,
    id: i32,
    shared: Arc<Shared>,
}

impl WaiterWatch {
    /// Whether a waiter may have registered since the watch started: one did, or the
    /// listening connection did not listen all along (when in doubt, yes).
    pub(super) fn appeared(&self) -> bool {
        !self.listened
            || self.listening.has_changed().unwrap_or(true)
            || self.shared.appeared_count(self.id) != Some(self.start)
    }

    /// Completes once [`appeared`](Self::appeared) is true.
    pub(super) fn wait(&self) -> BoxFuture<'static, ()> {
        if self.appeared() {
            return Box::pin(std::future::ready(()));
        }
        let (shared, id, start) = (self.shared.clone(), self.id, self.start);
        let mut listening = self.listening.clone();
        Box::pin(async move {
            loop {
                // Listening before looking: a bump after the look is not missed.
                let bumped = shared.bumped.notified();
                tokio::pin!(bumped);
                bumped.as_mut().enable();
                if shared.appeared_count(id) != Some(start) {
                    return;
                }
                tokio::select! {
                    _ = bumped => {}
                    _ = listening.changed() => return,
                }
            }
        })
    }
}

impl Drop for WaiterWatch {
    fn drop(&mut self) {
        let mut appeared = self.shared.appeared.lock().expect("not poisoned");
        if let Some(a) = appeared.get_mut(&self.id) {
            a.watchers -= 1;
            if a.watchers == 0 {
                appeared.remove(&self.id);
            }
        }
    }
}

/// The registrations of waiters notified for one lock id, while [`WaiterWatch`]es read them.
#[derive(Default)]
struct Appeared {
    count: u64,
    watchers: usize,
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The task that drives the listening connection: aborted (so the connection closed) with the
/// hub's task.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Keeps a connection listening and registered for the ids waited for; connects again when it
/// breaks.
async fn run(cc: Arc<ConnConfig>, shared: Arc<Shared>, mut orders: mpsc::UnboundedReceiver<Order>) {
    loop {
        let connected = idle(
            &mut orders,
            tokio::time::timeout(cc.connect_timeout, cc.config.connect(cc.tls.clone())),
        )
        .await;
        if let Ok(Ok((client, mut connection))) = connected {
            let notified = shared.clone();
            let mut driver = AbortOnDrop(tokio::spawn(async move {
                let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
                while let Some(message) = messages.next().await {
                    match message {
                        Ok(AsyncMessage::Notification(n)) if n.channel() == wire::WAIT_CHANNEL => {
                            if let Ok(id) = n.payload().parse() {
                                notified.appeared(id);
                            }
                        }
                        Ok(AsyncMessage::Notification(n)) => {
                            notified.wake(n.payload().parse().ok());
                        }
                        Ok(_) => {}
                        Err(_) => break,
                    }
                }
            }));
            session(&client, &cc, &shared, &mut orders, &mut driver.0).await;
            drop(driver);
            drop(client);
            // Not listening: holders can no longer tell whether someone waits.
            shared.listening.send_modify(|n| *n += *n % 2);
            // The session's registrations ended with it; releases since were missed.
            for e in shared.entries().values() {
                e.registered.send_replace(false);
            }
            shared.wake(None);
            tracing::debug!("zklock: the PostgreSQL listening connection ended; connecting again");
        }
        idle(&mut orders, tokio::time::sleep(RECONNECT_PAUSE)).await;
    }
}

/// Runs `step` while no listening connection is up: nothing is registered, so a flush is
/// answered at once; other orders are dropped (a session registers every id waited for when
/// it starts).
async fn idle<T>(
    orders: &mut mpsc::UnboundedReceiver<Order>,
    step: impl std::future::Future<Output = T>,
) -> T {
    tokio::pin!(step);
    loop {
        tokio::select! {
            done = &mut step => return done,
            Some(order) = orders.recv() => {
                if let Order::Flush(done) = order {
                    let _ = done.send(());
                }
            }
        }
    }
}

/// Serves one listening connection until it breaks. (The hub's task owns a sender of `orders`
/// through `shared`, so they never end while it runs.)
async fn session(
    client: &Client,
    cc: &ConnConfig,
    shared: &Shared,
    orders: &mut mpsc::UnboundedReceiver<Order>,
    driver: &mut JoinHandle<()>,
) {
    // The server ends the session once it hears nothing for the lease (see the module's docs);
    // before PostgreSQL 14 there is no such setting, and only the checks below are left.
    let lease = wire::set_idle_session_timeout(cc.lease);
    match tokio::time::timeout(cc.reply_timeout, client.batch_execute(&lease)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) if e.code() == Some(&SqlState::UNDEFINED_OBJECT) => {}
        _ => return,
    }
    let listen = wire::listen();
    if !matches!(
        tokio::time::timeout(cc.reply_timeout, client.batch_execute(&listen)).await,
        Ok(Ok(()))
    ) {
        return;
    }
    let mut held = Held::default();
    let waited: Vec<i32> = shared.entries().keys().copied().collect();
    let queued: Vec<i32> = shared
        .queued
        .lock()
        .expect("not poisoned")
        .keys()
        .copied()
        .collect();
    let orders_now = (waited.into_iter().map(Registration::Wait))
        .chain(queued.into_iter().map(Registration::Queue));
    for order in orders_now.collect::<Vec<_>>() {
        if !register(client, cc, shared, &mut held, order).await {
            return;
        }
    }
    // Registered again: now wake everyone, who may have missed a release.
    shared.wake(None);
    shared.listening.send_modify(|n| *n += 1 - *n % 2);
    // A request at least every lease/3 keeps the session from the server's idle timeout, and
    // one unanswered within the reply timeout ends this connection: it went silent.
    let mut check =
        tokio::time::interval_at(tokio::time::Instant::now() + cc.lease / 3, cc.lease / 3);
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = &mut *driver => return,
            order = orders.recv() => match order {
                Some(Order::Flush(done)) => {
                    if !unwanted(client, cc, shared, &mut held).await {
                        return;
                    }
                    let _ = done.send(());
                }
                Some(Order::Register(order)) => {
                    if !register(client, cc, shared, &mut held, order).await {
                        return;
                    }
                }
                None => return,
            },
            _ = check.tick() => {
                // Registrations of waits in the server's queue that are no longer wanted.
                let ended: Vec<i32> = held.queue.iter().copied().collect();
                for id in ended {
                    if !register(client, cc, shared, &mut held, Registration::Queue(id)).await {
                        return;
                    }
                }
                let answered = tokio::time::timeout(cc.reply_timeout, client.simple_query(wire::PING)).await;
                if !matches!(answered, Ok(Ok(_))) {
                    tracing::warn!("zklock: the PostgreSQL listening connection did not answer a liveness check; connecting again");
                    return;
                }
            }
        }
    }
}

/// The registrations the listening connection holds.
#[derive(Default)]
struct Held {
    wait: HashSet<i32>,
    queue: HashSet<i32>,
}

/// Ends every registration that nobody wants now, lingering ones included (a flush). `false`
/// when the connection failed.
async fn unwanted(client: &Client, cc: &ConnConfig, shared: &Shared, held: &mut Held) -> bool {
    let waits: Vec<i32> = {
        let entries = shared.entries();
        held.wait
            .iter()
            .copied()
            .filter(|id| !entries.contains_key(id))
            .collect()
    };
    let queues: Vec<i32> = {
        let mut queued = shared.queued.lock().expect("not poisoned");
        let ended: Vec<i32> = (held.queue.iter().copied())
            .filter(|id| queued.get(id).is_none_or(|e| e.count == 0))
            .collect();
        // No linger: gone now, and a wait that starts from here registers again.
        for id in &ended {
            queued.remove(id);
        }
        ended
    };
    let orders = (waits.into_iter().map(Registration::Wait))
        .chain(queues.into_iter().map(Registration::Queue));
    for order in orders {
        if !register(client, cc, shared, held, order).await {
            return false;
        }
    }
    true
}

/// Makes the connection's registration of `order`'s id match whether anyone waits for it (of
/// its kind), and tells the waiters. `false` when the connection failed.
async fn register(
    client: &Client,
    cc: &ConnConfig,
    shared: &Shared,
    held: &mut Held,
    order: Registration,
) -> bool {
    let (wanted, held, id, take, end) = match order {
        Registration::Wait(id) => (
            shared.entries().contains_key(&id),
            &mut held.wait,
            id,
            wire::WAIT,
            wire::UNWAIT,
        ),
        Registration::Queue(id) => {
            let mut queued = shared.queued.lock().expect("not poisoned");
            let wanted = queued.get(&id).is_some_and(|e| e.wanted(Instant::now()));
            if !wanted {
                // Forgotten now; a wait that starts from here orders its registration again.
                queued.remove(&id);
            }
            (wanted, &mut held.queue, id, wire::QUEUE, wire::UNQUEUE)
        }
    };
    let statement = match (wanted, held.contains(&id)) {
        (true, false) => Some(take),
        (false, true) => Some(end),
        _ => None,
    };
    if let Some(statement) = statement {
        let done = tokio::time::timeout(
            cc.reply_timeout,
            client.query_typed(statement, &[(&id, Type::INT4)]),
        )
        .await;
        if !matches!(done, Ok(Ok(_))) {
            return false;
        }
        if wanted {
            held.insert(id);
        } else {
            held.remove(&id);
        }
    }
    if let Registration::Wait(id) = order {
        if let Some(e) = shared.entries().get(&id) {
            e.registered.send_replace(held.contains(&id));
        }
    }
    true
}

/// A waiter's interest in one lock id's releases.
pub(super) struct Listener {
    wake: watch::Receiver<u64>,
    registered: watch::Receiver<bool>,
    id: i32,
    shared: Arc<Shared>,
}

impl Listener {
    /// The lock id listened for.
    pub(super) fn id(&self) -> i32 {
        self.id
    }

    /// Waits, at most `within`, until releases of the id will be notified to this backend.
    /// Past that (the listening connection is down), the waiter relies on its fallback poll.
    pub(super) async fn registered(&mut self, within: Duration) {
        let _ = tokio::time::timeout(within, self.registered.wait_for(|r| *r)).await;
    }

    /// Forgets the releases so far: call before each attempt.
    pub(super) fn mark(&mut self) {
        self.wake.borrow_and_update();
    }

    /// Waits for a release since the last [`mark`](Self::mark), at most `fallback`.
    pub(super) async fn wait(&mut self, fallback: Duration) {
        let _ = tokio::time::timeout(fallback, self.wake.changed()).await;
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut entries = self.shared.entries();
        // This listener's receiver is the last one: nobody else here waits for the id.
        if entries
            .get(&self.id)
            .is_some_and(|e| e.wake.receiver_count() <= 1)
        {
            entries.remove(&self.id);
            let _ = self
                .shared
                .orders
                .send(Order::Register(Registration::Wait(self.id)));
        }
    }
}
