//! The hub's task: it owns the pub/sub connections (one, or on Cluster one per primary),
//! serves the listeners' (un)subscribe requests in order, dispatches messages to the
//! listeners, and reconnects while anyone listens.

use std::sync::atomic::Ordering;
use std::sync::Weak;
use std::time::Duration;

use futures::StreamExt;
use redis::aio::{PubSubSink, PubSubStream};
use tokio::sync::{mpsc, watch};

use super::super::breaks::Breaks;
use super::super::servers::Servers;
use super::{Request, Shared};
use crate::backend::backoff::Backoff;

/// The first pause before reconnecting a broken pub/sub connection; doubled up to
/// [`RECONNECT_MAX`].
const RECONNECT_MIN: Duration = Duration::from_millis(50);
const RECONNECT_MAX: Duration = Duration::from_secs(2);

/// The hub's task: owns the pub/sub connections, serves (un)subscribe requests in order, and
/// dispatches messages.
pub(super) async fn run(
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
