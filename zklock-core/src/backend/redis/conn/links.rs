//! The Redis backend's command connections: one multiplexed connection per server, replaced
//! when it breaks, each break counted in the backend's [`Breaks`] for the holds it reaches.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, RedisError, RedisResult};
use tokio::sync::Mutex as AsyncMutex;

use crate::types::backend_kind::BackendKind;

use super::super::error::{connection_failed, read_only, timed_out};
use super::super::wire::split_addr;
use super::breaks::Breaks;
use super::servers::{Servers, Trust};

/// One open connection to a server, and whether it broke (set once, by its driver's end, a
/// failed request or a failover; the break is counted in [`Breaks`] by whoever sets it first).
#[derive(Clone)]
struct Link {
    connection: MultiplexedConnection,
    broken: Arc<AtomicBool>,
    /// The server it goes to.
    node: NodeKey,
    /// Under Sentinel, what it must still be to be taken into use.
    trust: Trust,
}

impl Link {
    fn usable(&self) -> Option<Link> {
        (!self.broken.load(Ordering::SeqCst)).then(|| self.clone())
    }
}

/// Which server a connection goes to: the one server (or the primary the Sentinels name), or a
/// Cluster node by address.
type NodeKey = Option<(String, u16)>;

/// The connections commands go through: one multiplexed connection per server (one server,
/// or each Cluster primary a request went to). Requests are pipelined on it; when it breaks,
/// the next request opens a new one.
pub(crate) struct Conn {
    /// Where connections go: the one server, the primary the Sentinels name, or the Cluster
    /// node that owns a key's slot.
    pub(crate) servers: Servers,
    connect_timeout: Duration,
    config: AsyncConnectionConfig,
    /// How long one request may wait for its reply before the connection is taken for broken.
    pub(crate) reply_timeout: Duration,
    links: StdMutex<HashMap<NodeKey, Link>>,
    /// Per server, held while a connection to it is opened, so that concurrent requests open
    /// one, not many (and a dead Cluster node holds up only the requests for it).
    opening: StdMutex<HashMap<NodeKey, Arc<AsyncMutex<()>>>>,
    /// Bumped once per connection that breaks.
    breaks: Breaks,
    /// Where the connections' drivers run (the manager's runtime).
    runtime: tokio::runtime::Handle,
}

impl Conn {
    pub(crate) fn new(
        servers: Servers,
        connect_timeout: Duration,
        reply_timeout: Duration,
        breaks: Breaks,
        runtime: tokio::runtime::Handle,
    ) -> Conn {
        // Replies are bounded here, per request (`run`), not by the client: a renewal's bound
        // is its lease, not a fixed timeout.
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(connect_timeout))
            .set_response_timeout(None);
        Conn {
            servers,
            connect_timeout,
            config,
            reply_timeout,
            links: StdMutex::new(HashMap::new()),
            opening: StdMutex::new(HashMap::new()),
            breaks,
            runtime,
        }
    }

    /// Counts the break of the connection to `node` in the epoch, once (whoever marks it
    /// first), for the holds it reaches: on Cluster those in the node's slots.
    fn count_break(servers: &Servers, breaks: &Breaks, broken: &AtomicBool, node: &NodeKey) {
        if !broken.swap(true, Ordering::SeqCst) {
            breaks.broke(servers.slots_of(node).as_deref());
        }
    }

    /// Opens a connection to `node` (`None`: the one server, or the Sentinels' primary), over
    /// TCP (with TLS if asked) or a Unix socket. It is driven by a task of this backend, so
    /// its end (the server closed it, restarted, or the socket failed) counts as a break at
    /// once, not at the next request.
    async fn open(&self, node: &NodeKey) -> RedisResult<Link> {
        let (client, trust) = match node {
            Some((host, port)) => (self.servers.node_client(host, *port)?, None),
            None => self.servers.client(self.connect_timeout).await?,
        };
        let broken = Arc::new(AtomicBool::new(false));
        let (mut connection, driver) = self
            .servers
            .dial()
            .multiplexed(&client, &self.config)
            .await?;
        let (servers, breaks, flag) = (self.servers.clone(), self.breaks.clone(), broken.clone());
        let at = node.clone();
        self.runtime.spawn(async move {
            driver.await;
            Conn::count_break(&servers, &breaks, &flag, &at);
        });
        // Under Sentinel, only a server that says it is the primary is used (asked once the
        // driver runs: it carries the reply).
        if self.servers.checks_role() {
            let checked = tokio::time::timeout(
                self.connect_timeout,
                super::sentinel::check_primary(&mut connection),
            )
            .await
            .unwrap_or_else(|_| Err(timed_out()));
            if let Err(e) = checked {
                // Never used: not a break of anything this backend holds.
                broken.store(true, Ordering::SeqCst);
                return Err(e);
            }
        }
        Ok(Link {
            connection,
            broken,
            node: node.clone(),
            trust,
        })
    }

    /// The current connection to `node`, without waiting, if one is open and not broken.
    fn current(&self, node: &NodeKey) -> Option<Link> {
        self.links.lock().unwrap().get(node).and_then(Link::usable)
    }

    /// The connection to `node`, opening one if there is none (or it broke).
    async fn get(&self, node: &NodeKey) -> RedisResult<Link> {
        if let Some(link) = self.current(node) {
            return Ok(link);
        }
        let opening = self
            .opening
            .lock()
            .unwrap()
            .entry(node.clone())
            .or_default()
            .clone();
        let _opening = opening.lock().await;
        if let Some(link) = self.current(node) {
            return Ok(link);
        }
        let link = self.open(node).await?;
        let mut links = self.links.lock().unwrap();
        // Under Sentinel, a failover acted on while it was opened (under this lock, the
        // failover drops every connection in the map) makes it one to a primary this process
        // no longer trusts: a primary frozen past the failover says `master` once woken.
        if !self.servers.still_trusted(&link.trust) {
            // Never used: not a break of anything this backend holds.
            link.broken.store(true, Ordering::SeqCst);
            return Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                "the primary this connection was opened to was failed over meanwhile",
            )));
        }
        links.insert(node.clone(), link.clone());
        Ok(link)
    }

    /// The connection `link` broke, or stayed silent: the next request opens a new one.
    /// Counted as a break.
    fn broken(&self, link: &Link) {
        Conn::count_break(&self.servers, &self.breaks, &link.broken, &link.node);
    }

    /// The server of `link` is no longer the primary (`None`: a Sentinel said the primary
    /// changed, whatever connection is current): the connection (every connection, for a
    /// Sentinel's word) is forgotten, and every hold it reaches (on Cluster, those in the
    /// node's slots; else every hold) confirmed before is lost to a failover.
    pub(crate) fn failed_over_at(&self, link: Option<&LinkRef>) {
        let first = match link {
            Some(link) => !link.0.broken.swap(true, Ordering::SeqCst),
            None => {
                for link in self.links.lock().unwrap().values() {
                    link.broken.store(true, Ordering::SeqCst);
                }
                true
            }
        };
        // A connection's `-READONLY` replies count once, like its break; a Sentinel's
        // announcement always does (the current connection may be to the new primary already).
        if first {
            let slots = link.and_then(|l| self.servers.slots_of(&l.0.node));
            self.breaks.failed_over(slots.as_deref());
            crate::metrics::failover(BackendKind::Redis);
        }
    }

    /// Runs one request, on the connection to the server that owns `route` (a key of the
    /// request: on Cluster, the node of its slot; else the one server), bounded by `timeout`
    /// when given; a connection that fails or stays silent is replaced for the next request.
    /// Getting a connection has a timeout of its own only when one must be waited for (opened,
    /// or another request is opening it).
    ///
    /// On Cluster, a `-MOVED` reply (the slot has another owner: a failover or a migration) is
    /// a failover for the holds on the node that sent it (a failover moves all its slots), and
    /// the request goes to the new owner; `-ASK` (the slot is
    /// migrating and the key is on the target) sends it once to the target, after `ASKING`;
    /// `-TRYAGAIN` (the keys are split by a migration) and `-CLUSTERDOWN` are transient.
    pub(crate) async fn run<T, F, Fut>(
        &self,
        route: &str,
        timeout: Option<Duration>,
        mut request: F,
    ) -> RedisResult<T>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let mut redirects = 0;
        loop {
            let node = self.servers.node_of(route, self.connect_timeout).await?;
            let opened = match (self.current(&node), timeout) {
                (Some(link), _) => Ok(link),
                (None, Some(t)) => tokio::time::timeout(t, self.get(&node))
                    .await
                    .unwrap_or_else(|_| Err(timed_out())),
                (None, None) => self.get(&node).await,
            };
            let link = match opened {
                Ok(link) => link,
                Err(e) => {
                    // The slot's node cannot be reached: its replica may have taken over since
                    // the map was asked for.
                    if connection_failed(&e) {
                        self.servers.node_failed();
                    }
                    return Err(e);
                }
            };
            let result = match timeout {
                Some(t) => tokio::time::timeout(t, request(link.connection.clone()))
                    .await
                    .unwrap_or_else(|_| Err(timed_out())),
                None => request(link.connection.clone()).await,
            };
            let Err(e) = &result else { return result };
            if read_only(e) {
                // The server turned replica under us: a failover, whether or not a
                // Sentinel told us yet.
                self.failed_over_at(Some(&LinkRef(link)));
            } else if let Some((addr, slot)) = e.redirect_node() {
                redirects += 1;
                if redirects > MAX_REDIRECTS {
                    return result;
                }
                let addr = addr.to_string();
                if matches!(
                    e.kind(),
                    redis::ErrorKind::Server(redis::ServerErrorKind::Moved)
                ) {
                    // The slot has a new owner: a failover for the old owner's holds (their
                    // leases may not have reached the new owner). The old node's connection
                    // goes with it, and is opened again when asked for.
                    self.failed_over_at(Some(&LinkRef(link)));
                    self.servers.moved(slot, &addr);
                    continue;
                }
                return self.asking(&addr, &mut request).await;
            } else if connection_failed(e) {
                self.broken(&link);
                self.servers.node_failed();
            }
            return result;
        }
    }

    /// Runs one request on the connection to `node` (see [`Servers::every_node`]), bounded by
    /// `timeout`; no redirect is followed (a scan of each node's own keys).
    pub(crate) async fn run_node<T, F, Fut>(
        &self,
        node: &NodeKey,
        timeout: Duration,
        request: F,
    ) -> RedisResult<T>
    where
        F: FnOnce(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let opened = tokio::time::timeout(timeout, self.get(node))
            .await
            .unwrap_or_else(|_| Err(timed_out()));
        let link = match opened {
            Ok(link) => link,
            Err(e) => {
                if connection_failed(&e) {
                    self.servers.node_failed();
                }
                return Err(e);
            }
        };
        let result = tokio::time::timeout(timeout, request(link.connection.clone()))
            .await
            .unwrap_or_else(|_| Err(timed_out()));
        if let Err(e) = &result {
            if connection_failed(e) {
                self.broken(&link);
                self.servers.node_failed();
            }
        }
        result
    }

    /// Sends `request` once to the Cluster node at `addr` (`host:port`) after `ASKING`, on a
    /// connection of its own (`ASKING` holds for the next command only).
    async fn asking<T, F, Fut>(&self, addr: &str, request: &mut F) -> RedisResult<T>
    where
        F: FnMut(MultiplexedConnection) -> Fut,
        Fut: Future<Output = RedisResult<T>>,
    {
        let (host, port) = split_addr(addr)?;
        let client = self.servers.node_client(&host, port)?;
        let mut c = self
            .servers
            .dial()
            .connection(&client, &self.config)
            .await?;
        redis::cmd("ASKING").query_async::<()>(&mut c).await?;
        request(c).await
    }
}

/// The most `-MOVED` redirects one request follows.
const MAX_REDIRECTS: usize = 5;

/// A connection as `Conn::failed_over_at` takes it.
pub(crate) struct LinkRef(Link);
