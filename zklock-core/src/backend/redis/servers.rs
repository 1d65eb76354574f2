//! Where the Redis backend's connections go ([`Servers`]): the one server of a `redis://` URL,
//! the primary the Sentinels name (`redis+sentinel://`, see [`sentinel`](super::sentinel)), or
//! the Cluster node that owns a key's slot (`redis+cluster://`, see [`cluster`](super::cluster)).

use std::sync::Arc;
use std::time::Duration;

use redis::{Client, RedisResult};

use super::cluster::Cluster;
use super::sentinel::Sentinels;

/// Where the backend's connections go.
#[derive(Clone)]
pub(crate) enum Servers {
    /// One server (`redis://`, `redis+unix://`, `unix://`).
    One(Box<Client>),
    /// The primary the Sentinels name.
    Sentinel(Arc<Sentinels>),
    /// The primaries of a Redis Cluster, each key on its slot's.
    Cluster(Arc<Cluster>),
}

impl Servers {
    /// The client of the server to connect to now when no key decides: the one server, the
    /// primary the first Sentinel that answers names, or (Cluster: for the pub/sub connection,
    /// which hears every node's messages) a primary of the Cluster.
    pub(crate) async fn client(&self, timeout: Duration) -> RedisResult<Client> {
        match self {
            Servers::One(client) => Ok(Client::clone(client)),
            Servers::Sentinel(s) => {
                let (host, port) = s.primary(timeout).await.map_err(|e| e.into_redis())?;
                s.data_client(host, port)
            }
            Servers::Cluster(c) => c.any_client(),
        }
    }

    /// The client of the Cluster node at `host:port`, with the URL's credentials.
    pub(crate) fn node_client(&self, host: &str, port: u16) -> RedisResult<Client> {
        match self {
            Servers::Cluster(c) => c.client(host, port),
            Servers::Sentinel(s) => s.data_client(host.to_string(), port),
            Servers::One(client) => Ok(Client::clone(client)),
        }
    }

    /// Which server a request about `key` goes to: `None` for the one server (or the
    /// Sentinels' primary); on Cluster, the primary that owns the key's slot (asking the
    /// Cluster for its slots first if none is known).
    pub(crate) async fn node_of(
        &self,
        key: &str,
        timeout: Duration,
    ) -> RedisResult<Option<(String, u16)>> {
        match self {
            Servers::Cluster(c) => c.node_of(key, timeout).await.map(Some),
            _ => Ok(None),
        }
    }

    /// A `-MOVED` reply said that `slot` is served by `addr` now.
    pub(crate) fn moved(&self, slot: u16, addr: &str) {
        if let Servers::Cluster(c) = self {
            c.moved(slot, addr);
        }
    }

    /// A request to a node failed on its connection: on Cluster, the slots' owners are asked
    /// for again before the next request (a replica may have taken over).
    pub(crate) fn node_failed(&self) {
        if let Servers::Cluster(c) = self {
            c.node_failed();
        }
    }

    /// The servers a scan of every key must visit: the one server, or every Cluster primary.
    pub(crate) async fn every_node(&self, timeout: Duration) -> Vec<Option<(String, u16)>> {
        match self {
            Servers::Cluster(c) => {
                if let Err(e) = c.refresh(timeout).await {
                    tracing::debug!(error = ?e, "zklock: could not ask the Redis Cluster for its slots");
                }
                c.primaries().into_iter().map(Some).collect()
            }
            _ => vec![None],
        }
    }

    /// Whether a fresh connection must say it is the primary (`ROLE`) before it is used.
    pub(crate) fn checks_role(&self) -> bool {
        matches!(self, Servers::Sentinel(_))
    }
}
