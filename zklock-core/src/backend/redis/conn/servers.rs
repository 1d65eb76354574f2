//! Where the Redis backend's connections go ([`Servers`]): the one server of a `redis://` URL,
//! the primary the Sentinels name (`redis+sentinel://`, see [`sentinel`](super::sentinel)), or
//! the Cluster node that owns a key's slot (`redis+cluster://`, see [`cluster`](super::cluster)).

use std::sync::Arc;
use std::time::Duration;

use redis::{Client, RedisResult};

use super::super::options::SentinelAuth;
use super::cluster::Cluster;
use super::dial::Dial;
use super::sentinel::Sentinels;
use crate::types::error::{Error, Result};
use crate::types::tls::Tls;

/// Under Sentinel, the primary a connection was opened to and the failovers acted on when it
/// was asked for; `None` elsewhere.
pub(crate) type Trust = Option<((String, u16), u64)>;

/// Where the backend's connections go.
#[derive(Clone)]
pub(crate) enum Servers {
    /// One server (`redis://`, `rediss://`, `redis+unix://`, `unix://`), and how to reach it.
    One(Box<Client>, Dial),
    /// The primary the Sentinels name.
    Sentinel(Arc<Sentinels>),
    /// The primaries of a Redis Cluster, each key on its slot's.
    Cluster(Arc<Cluster>),
}

impl Servers {
    /// Where the URL's connections go: its one server, the primary the Sentinels name
    /// (`redis+sentinel://`), or a Cluster's primaries (`redis+cluster://`), asked once at connect
    /// so that a wrong master name, no Sentinel or node answering, or a Cluster with slots
    /// uncovered is a clear error at connect.
    pub(crate) async fn of(
        given: &str,
        tls: Option<&Tls>,
        sentinel_auth: Option<&SentinelAuth>,
        connect_timeout: Duration,
    ) -> Result<Servers> {
        let (url, dial) = Dial::of(given, tls, connect_timeout);
        let url = url.as_str();
        let scheme = url.trim().to_ascii_lowercase();
        if scheme.starts_with(super::sentinel::SCHEME) {
            let sentinels = Sentinels::parse(url, sentinel_auth, dial)?;
            let named = sentinels
                .primary(connect_timeout)
                .await
                .map_err(|asked| sentinels.connect_error(asked, given))?;
            sentinels.trust(&named);
            return Ok(Servers::Sentinel(Arc::new(sentinels)));
        }
        if sentinel_auth.is_some() {
            return Err(Error::Config(
                "sentinel_password and sentinel_user are for redis+sentinel:// URLs: this URL \
                 names no Sentinel; give the server's password in the URL instead"
                    .to_string(),
            ));
        }
        if scheme.starts_with(super::cluster::SCHEME) {
            let cluster = Cluster::parse(url, dial)?;
            cluster
                .refresh(connect_timeout)
                .await
                .map_err(|asked| cluster.connect_error(asked, given))?;
            return Ok(Servers::Cluster(Arc::new(cluster)));
        }
        // The URL may carry a password: errors name the problem, not the URL.
        let client = redis::Client::open(url)
            .map_err(|e| Error::Config(format!("the Redis URL is not usable: {e}")))?;
        Ok(Servers::One(Box::new(client), dial))
    }

    /// The client of the server to connect to now when no key decides: the one server, the
    /// primary the Sentinels name if this process trusts it (see
    /// [`Sentinels::trusted_primary`]), or (Cluster: for the pub/sub connection, which hears
    /// every node's messages) a primary of the Cluster. Under Sentinel, also what a connection
    /// must still be to be used once open ([`Servers::still_trusted`]).
    pub(crate) async fn client(&self, timeout: Duration) -> RedisResult<(Client, Trust)> {
        match self {
            Servers::One(client, _) => Ok((Client::clone(client), None)),
            Servers::Sentinel(s) => {
                let (named, failovers) = s.trusted_primary(timeout).await?;
                let (host, port) = named.addr.clone();
                Ok((s.data_client(host, port)?, Some((named.addr, failovers))))
            }
            Servers::Cluster(c) => Ok((c.any_client()?, None)),
        }
    }

    /// Whether a connection opened under `trust` may be used: always off Sentinel; under
    /// Sentinel, if it goes to the trusted primary and no failover was acted on since it was
    /// asked for.
    pub(crate) fn still_trusted(&self, trust: &Trust) -> bool {
        match (self, trust) {
            (Servers::Sentinel(s), Some((addr, failovers))) => s.still_trusted(addr, *failovers),
            _ => true,
        }
    }

    /// The client of the Cluster node at `host:port`, with the URL's credentials.
    pub(crate) fn node_client(&self, host: &str, port: u16) -> RedisResult<Client> {
        match self {
            Servers::Cluster(c) => c.client(host, port),
            Servers::Sentinel(s) => s.data_client(host.to_string(), port),
            Servers::One(client, _) => Ok(Client::clone(client)),
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

    /// The slots whose holds a break of the connection to `node` reaches: on Cluster the
    /// node's slots in the map as last learned; `None` (every hold) off Cluster.
    pub(crate) fn slots_of(&self, node: &Option<(String, u16)>) -> Option<Vec<u16>> {
        match (self, node) {
            (Servers::Cluster(c), Some(addr)) => Some(c.slots_of(addr)),
            _ => None,
        }
    }

    /// The pub/sub connections the hub keeps: one to the server (`None`), or on Cluster one
    /// per primary of the slot map as last learned (the requests' routing asks the Cluster
    /// again when a node fails; the hub never waits on that).
    pub(crate) fn listened_nodes(&self) -> Vec<Option<(String, u16)>> {
        match self {
            Servers::Cluster(c) => c.primaries().into_iter().map(Some).collect(),
            _ => vec![None],
        }
    }

    /// Whether `node` is where the hub takes a message about `key` from. On Cluster every
    /// node delivers every message, the publishing node first: a message counts from the
    /// primary that owns `key`'s slot if one of `listened` is that primary, else from any node
    /// (a duplicate then only wakes a waiter twice). Always, off Cluster.
    pub(crate) fn first_hand<'a>(
        &self,
        node: Option<&(String, u16)>,
        key: &str,
        mut listened: impl Iterator<Item = Option<&'a (String, u16)>>,
    ) -> bool {
        let Servers::Cluster(c) = self else {
            return true;
        };
        match c.owner_of_key(key) {
            Some(owner) if listened.any(|n| n == Some(&owner)) => node == Some(&owner),
            _ => true,
        }
    }

    /// On Cluster, changes whenever the slot map does (see `Cluster::changes`).
    pub(crate) fn map_changes(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Servers::Cluster(c) => Some(c.changes()),
            _ => None,
        }
    }

    /// Whether `nodes` are every primary now known (off Cluster: whether there is one).
    pub(crate) fn covered_by(&self, nodes: &[Option<(String, u16)>]) -> bool {
        match self {
            Servers::Cluster(c) => {
                let primaries = c.primaries();
                !primaries.is_empty()
                    && primaries
                        .into_iter()
                        .all(|p| nodes.iter().any(|n| n.as_ref() == Some(&p)))
            }
            _ => !nodes.is_empty(),
        }
    }

    /// How connections are opened (TLS or not): the same for every server.
    pub(crate) fn dial(&self) -> &Dial {
        match self {
            Servers::One(_, dial) => dial,
            Servers::Sentinel(s) => &s.dial,
            Servers::Cluster(c) => &c.dial,
        }
    }

    /// Whether a fresh connection must say it is the primary (`ROLE`) before it is used.
    pub(crate) fn checks_role(&self) -> bool {
        matches!(self, Servers::Sentinel(_))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::redis::wire::keys::slot;

    #[test]
    fn a_cluster_message_counts_from_the_primary_of_its_slot_only() {
        let cluster =
            Cluster::parse("redis+cluster://127.0.0.1:7001", Dial::default()).expect("a URL");
        let key = "zklock:wake:{8df2810047fa336d}/zklock/locks/sku_7";
        cluster.moved(slot(key), "127.0.0.1:7002");
        let servers = Servers::Cluster(Arc::new(cluster));
        let (a, b) = (
            ("127.0.0.1".to_string(), 7001),
            ("127.0.0.1".to_string(), 7002),
        );
        let both = || [Some(&a), Some(&b)].into_iter();
        assert!(servers.first_hand(Some(&b), key, both()));
        assert!(
            !servers.first_hand(Some(&a), key, both()),
            "the copy another node relays over the bus is a duplicate"
        );
        // Not listening on the owner: whichever node delivers it counts.
        assert!(servers.first_hand(Some(&a), key, [Some(&a)].into_iter()));
        // A slot with no known owner: every copy counts.
        assert!(servers.first_hand(Some(&a), "zklock:wake:{other}/x", both()));
        // Off Cluster there is one connection.
        let one = Servers::One(
            Box::new(redis::Client::open("redis://127.0.0.1:1/").expect("a URL")),
            Dial::default(),
        );
        assert!(one.first_hand(None, key, [None].into_iter()));
    }
}
