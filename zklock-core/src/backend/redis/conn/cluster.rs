//! Redis Cluster: `redis+cluster://[user:password@]host:port[,host:port…]`. Which primary owns
//! each of the 16384 hash slots ([`Cluster`], asked with `CLUSTER SLOTS` at connect, after a
//! node failed, and updated by every `-MOVED`); a key's slot is [`slot`], in the key layout.
//!
//! Every key of one lock carries the same hash tag (see [`keys`](super::super::wire::keys)),
//! so a lock's scripts run on one node, in one slot. Wake-ups use ordinary pub/sub, which a Cluster
//! delivers to subscribers on every node, the others a bus hop later: the hub listens on every
//! primary and takes each message from the node that owns its lock's slot (see
//! [`hub`](super::hub)), told of map changes through [`Cluster::changes`].
//!
//! A hold is lost (`LossReason::Failover`) when its slot's owner changes in the map (a full
//! answer or a `-MOVED` reply: a failover or a migration; Redis's replication to the new owner
//! is asynchronous), or its node answers `-MOVED` for any slot or turned replica
//! (`-READONLY`); a break of a node's connection is a break for the holds in that node's slots
//! (see [`Breaks`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex as StdMutex;
use std::time::Duration;

use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError,
    RedisResult,
};

use super::super::error::tls_failure;
use super::super::wire::keys::{slot, SLOTS};
use super::breaks::Breaks;
use super::dial::Dial;
use crate::types::error::{Error, Result, ServerError};

/// The scheme of a Cluster URL.
pub(crate) const SCHEME: &str = "redis+cluster://";
/// No known owner.
const NONE: u16 = u16::MAX;

/// Which primary owns each slot, as last learned.
struct SlotMap {
    /// Per slot, an index into `nodes` ([`NONE`]: unknown).
    owner: Vec<u16>,
    /// The primaries' addresses.
    nodes: Vec<(String, u16)>,
    /// The nodes that own a slot, in `nodes`' order: kept by [`settle`](Self::settle) after
    /// every change, so that asking costs no scan of the slots.
    owners: Vec<(String, u16)>,
}

impl SlotMap {
    fn empty() -> SlotMap {
        SlotMap {
            owner: vec![NONE; SLOTS],
            nodes: Vec::new(),
            owners: Vec::new(),
        }
    }

    /// Recomputes [`owners`](Self::owners) after the slots changed.
    fn settle(&mut self) {
        let mut owns = vec![false; self.nodes.len()];
        for &o in &self.owner {
            if o != NONE {
                owns[usize::from(o)] = true;
            }
        }
        self.owners = self
            .nodes
            .iter()
            .zip(owns)
            .filter(|(_, owns)| *owns)
            .map(|(n, _)| n.clone())
            .collect();
    }

    fn node(&mut self, addr: (String, u16)) -> u16 {
        match self.nodes.iter().position(|n| *n == addr) {
            Some(i) => i as u16,
            None => {
                self.nodes.push(addr);
                (self.nodes.len() - 1) as u16
            }
        }
    }

    /// The slots whose owner is another in `new` than here (known or not).
    fn changed_in(&self, new: &SlotMap) -> Vec<u16> {
        // This map's node indexes in `new`'s numbering.
        let renumbered: Vec<u16> = self
            .nodes
            .iter()
            .map(|n| {
                new.nodes
                    .iter()
                    .position(|m| m == n)
                    .map_or(NONE, |i| i as u16)
            })
            .collect();
        (0..SLOTS as u16)
            .filter(|&s| {
                let old = self.owner[usize::from(s)];
                let old = if old == NONE {
                    NONE
                } else {
                    renumbered[usize::from(old)]
                };
                old == NONE || old != new.owner[usize::from(s)]
            })
            .collect()
    }

    fn owner_of(&self, slot: u16) -> Option<(String, u16)> {
        let i = self.owner[usize::from(slot)];
        (i != NONE).then(|| self.nodes[usize::from(i)].clone())
    }

    fn uncovered(&self) -> usize {
        self.owner.iter().filter(|&&o| o == NONE).count()
    }
}

/// What asking the Cluster for its slots found, when it found no full map.
#[derive(Debug)]
pub(crate) enum Asked {
    /// No node answered (the last error).
    NoNode(Option<RedisError>),
    /// A node answered, but runs without cluster support.
    NotCluster(String),
    /// The map leaves this many slots without a primary.
    Uncovered(usize),
    /// A node refused the URL's credentials.
    Refused(String),
}

/// The nodes of one Redis Cluster and the slots' owners.
pub(crate) struct Cluster {
    /// The addresses the URL gives, asked when no known primary answers.
    seeds: Vec<(String, u16)>,
    /// The nodes' connection settings (credentials); the address is set per node.
    data: ConnectionInfo,
    map: StdMutex<SlotMap>,
    /// A node failed since the map was last asked for: ask again before the next request.
    stale: AtomicBool,
    /// Held while the map is asked for, so that concurrent requests ask once.
    refreshing: tokio::sync::Mutex<()>,
    /// Turns which node is asked (or listened on) first, so that a dead one is not always
    /// first.
    turn: std::sync::atomic::AtomicUsize,
    /// Counts changes of the map (a full answer, a `-MOVED`).
    changes: tokio::sync::watch::Sender<u64>,
    /// The backend's breaks, per slot: a slot whose owner changes is a failover of its holds.
    breaks: Breaks,
    /// How the nodes are reached (TLS or not).
    pub(crate) dial: Dial,
}

impl Cluster {
    /// Parses `redis+cluster://[user:password@]host:port[,host:port…][/]`.
    ///
    /// # Errors
    /// [`Error::Config`] naming what is wrong (never the password).
    pub(crate) fn parse(url: &str, dial: Dial) -> Result<Cluster> {
        let bad = |what: &str| {
            Error::Config(format!(
                "the Redis Cluster URL is not usable: {what}; give \
                 redis+cluster://[user:password@]host:port[,host:port...]"
            ))
        };
        let trimmed = url.trim();
        let rest = trimmed
            .get(SCHEME.len()..)
            .filter(|_| trimmed.to_ascii_lowercase().starts_with(SCHEME))
            .ok_or_else(|| bad("it does not start with redis+cluster://"))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        if !path.is_empty() {
            return Err(bad(
                "a Cluster has one database (0): the URL takes no path after the hosts",
            ));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let mut seeds = Vec::new();
        for host in hosts.split(',').filter(|h| !h.is_empty()) {
            let addr = super::super::wire::split_addr(host)
                .map_err(|_| bad(&format!("the node {host:?} is not host:port")))?;
            seeds.push(addr);
        }
        if seeds.is_empty() {
            return Err(bad("it names no node"));
        }
        let data_url = format!(
            "redis://{}127.0.0.1:6379/0",
            userinfo.map(|u| format!("{u}@")).unwrap_or_default()
        );
        let data = data_url
            .as_str()
            .into_connection_info()
            .map_err(|_| bad("the credentials are not usable"))?;
        Ok(Cluster {
            seeds,
            data,
            map: StdMutex::new(SlotMap::empty()),
            stale: AtomicBool::new(true),
            refreshing: tokio::sync::Mutex::new(()),
            turn: std::sync::atomic::AtomicUsize::new(0),
            changes: tokio::sync::watch::channel(0).0,
            breaks: Breaks::of_cluster(),
            dial,
        })
    }

    /// The client of the node at `host:port`, with the URL's credentials.
    pub(crate) fn client(&self, host: &str, port: u16) -> RedisResult<Client> {
        Client::open(
            self.data
                .clone()
                .set_addr(ConnectionAddr::Tcp(host.to_string(), port)),
        )
    }

    /// The client of some node (the pub/sub connection's: any node hears every message), a
    /// different one on each call.
    pub(crate) fn any_client(&self) -> RedisResult<Client> {
        let (host, port) = self.candidates()[0].clone();
        self.client(&host, port)
    }

    /// The known primaries, then the URL's other nodes, starting at a turning point.
    fn candidates(&self) -> Vec<(String, u16)> {
        let mut candidates = self.primaries();
        for seed in &self.seeds {
            if !candidates.contains(seed) {
                candidates.push(seed.clone());
            }
        }
        let turn = self.turn.fetch_add(1, Ordering::Relaxed) % candidates.len();
        candidates.rotate_left(turn);
        candidates
    }

    /// Every primary that owns a slot, as last learned.
    pub(crate) fn primaries(&self) -> Vec<(String, u16)> {
        self.map.lock().unwrap().owners.clone()
    }

    /// The backend's breaks, which count a slot whose owner changed as a failover of the holds
    /// in it.
    pub(crate) fn breaks(&self) -> Breaks {
        self.breaks.clone()
    }

    /// The slots the node at `addr` owns in the map as last learned.
    pub(crate) fn slots_of(&self, addr: &(String, u16)) -> Vec<u16> {
        let map = self.map.lock().unwrap();
        let Some(i) = map.nodes.iter().position(|n| n == addr) else {
            return Vec::new();
        };
        (0..SLOTS as u16)
            .filter(|&s| map.owner[usize::from(s)] == i as u16)
            .collect()
    }

    /// The primary that owns `key`'s slot in the map as last learned, if one is known.
    pub(crate) fn owner_of_key(&self, key: &str) -> Option<(String, u16)> {
        self.map.lock().unwrap().owner_of(slot(key))
    }

    /// Changes whenever the map does (a full answer to `CLUSTER SLOTS`, a `-MOVED`): the
    /// primaries to listen on may be others.
    pub(crate) fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// The primary that owns `key`'s slot, asking the Cluster for its map first when a node
    /// failed since, or the slot has no known owner.
    pub(crate) async fn node_of(&self, key: &str, timeout: Duration) -> RedisResult<(String, u16)> {
        let slot = slot(key);
        if !self.stale.load(Ordering::SeqCst) {
            if let Some(node) = self.map.lock().unwrap().owner_of(slot) {
                return Ok(node);
            }
        }
        // A map that cannot be had now: the last one known is used (the request then fails
        // or is redirected).
        if let Err(e) = self.refresh(timeout).await {
            tracing::debug!(error = ?e, "zklock: could not ask the Redis Cluster for its slots");
        }
        self.map.lock().unwrap().owner_of(slot).ok_or_else(|| {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::NotConnected,
                format!("no Redis Cluster primary serves slot {slot} now"),
            ))
        })
    }

    /// A `-MOVED` reply: `slot` is served by `addr` now.
    pub(crate) fn moved(&self, slot: u16, addr: &str) {
        if let Ok(addr) = super::super::wire::split_addr(addr) {
            let mut map = self.map.lock().unwrap();
            let i = map.node(addr);
            let changed = map.owner[usize::from(slot)] != i;
            map.owner[usize::from(slot)] = i;
            map.settle();
            drop(map);
            if changed {
                self.breaks.failed_over(Some(&[slot]));
            }
            self.changes.send_modify(|n| *n += 1);
        }
        // Other slots may have moved with it (a failover moves all of a node's).
        self.stale.store(true, Ordering::SeqCst);
    }

    /// A node failed: the map is asked for again before the next request.
    pub(crate) fn node_failed(&self) {
        self.stale.store(true, Ordering::SeqCst);
    }

    /// Asks the known primaries, then the URL's nodes, for the slots' owners (`CLUSTER
    /// SLOTS`), each within `timeout`, and keeps the first full answer.
    pub(crate) async fn refresh(&self, timeout: Duration) -> std::result::Result<(), Asked> {
        let _refreshing = self.refreshing.lock().await;
        if !self.stale.load(Ordering::SeqCst) {
            return Ok(());
        }
        let mut last = Asked::NoNode(None);
        for (host, port) in self.candidates() {
            let asked = tokio::time::timeout(timeout, async {
                let mut c = self
                    .dial
                    .connection(&self.client(&host, port)?, &AsyncConnectionConfig::new())
                    .await?;
                redis::cmd("CLUSTER")
                    .arg("SLOTS")
                    .query_async::<redis::Value>(&mut c)
                    .await
            })
            .await
            .unwrap_or_else(|_| Err(super::super::error::timed_out()));
            match asked {
                Ok(reply) => match parse_slots(&reply, &host) {
                    Some(map) if map.uncovered() == 0 => {
                        let mut current = self.map.lock().unwrap();
                        let changed = current.changed_in(&map);
                        *current = map;
                        drop(current);
                        if !changed.is_empty() {
                            self.breaks.failed_over(Some(&changed));
                        }
                        self.stale.store(false, Ordering::SeqCst);
                        self.changes.send_modify(|n| *n += 1);
                        return Ok(());
                    }
                    Some(map) => last = Asked::Uncovered(map.uncovered()),
                    None => last = Asked::NoNode(None),
                },
                Err(e) if e.to_string().contains("cluster support disabled") => {
                    last = Asked::NotCluster(format!("{host}:{port}"));
                }
                Err(e)
                    if matches!(
                        e.kind(),
                        redis::ErrorKind::AuthenticationFailed
                            | redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm)
                    ) =>
                {
                    last = Asked::Refused(format!("{host}:{port}"));
                }
                Err(e) => {
                    // A TLS failure is kept over the other nodes' errors: it is what the user
                    // must fix.
                    let kept_tls =
                        matches!(&last, Asked::NoNode(Some(l)) if tls_failure(l).is_some());
                    if matches!(last, Asked::NoNode(_)) && !kept_tls {
                        last = Asked::NoNode(Some(e));
                    }
                }
            }
        }
        Err(last)
    }

    /// What [`refresh`](Self::refresh) found at connect, as the error a user reads: a node that
    /// failed TLS is [`Error::Tls`] naming it.
    pub(crate) fn connect_error(&self, asked: Asked, url: &str) -> Error {
        if let Asked::NoNode(Some(e)) = &asked {
            if let Some(failure) = tls_failure(e) {
                return failure;
            }
        }
        let nodes: Vec<String> = self.seeds.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        match asked {
            Asked::NotCluster(addr) => Error::Config(format!(
                "the Redis Cluster URL names {addr}, which runs without cluster support: give \
                 the address of a Cluster node, or connect to a single server with \
                 redis://{addr}"
            )),
            Asked::Refused(addr) => Error::Config(format!(
                "the Redis Cluster node {addr} refused the URL's credentials: check the user and \
                 password (ACL LIST on the node), then retry"
            )),
            Asked::Uncovered(n) => Error::Config(format!(
                "the Redis Cluster at {} leaves {n} of its 16384 slots without a primary (CLUSTER \
                 INFO shows cluster_state): assign every slot, or wait until a failed \
                 primary's replica took over, then retry",
                nodes.join(", ")
            )),
            Asked::NoNode(e) => {
                let e = e.unwrap_or_else(|| {
                    RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::NotConnected,
                        "no node answered CLUSTER SLOTS",
                    ))
                });
                Error::Unreachable {
                    connect: crate::types::error::redacted(url),
                    source: ServerError::new(
                        std::sync::Arc::new(e.clone()),
                        format!("{e} (asked {})", nodes.join(", ")),
                        true,
                        "check that the Cluster's nodes run and that the addresses are theirs, \
                         then retry",
                    ),
                }
            }
        }
    }
}

/// The map a `CLUSTER SLOTS` reply gives: `[[start, end, [host, port, ...], replicas...],
/// ...]`. A node that gives no host (an empty string) is `asked`, the node that answered.
fn parse_slots(reply: &redis::Value, asked: &str) -> Option<SlotMap> {
    let int = |v: &redis::Value| match v {
        redis::Value::Int(i) => Some(*i),
        _ => None,
    };
    let text = |v: &redis::Value| match v {
        redis::Value::BulkString(b) => Some(String::from_utf8_lossy(b).into_owned()),
        redis::Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    let redis::Value::Array(ranges) = reply else {
        return None;
    };
    let mut map = SlotMap::empty();
    for range in ranges {
        let redis::Value::Array(fields) = range else {
            return None;
        };
        let (start, end) = (int(fields.first()?)?, int(fields.get(1)?)?);
        let redis::Value::Array(primary) = fields.get(2)? else {
            return None;
        };
        let host = text(primary.first()?)?;
        let host = if host.is_empty() {
            asked.to_string()
        } else {
            host
        };
        let port = u16::try_from(int(primary.get(1)?)?).ok()?;
        let i = map.node((host, port));
        let (start, end) = (usize::try_from(start).ok()?, usize::try_from(end).ok()?);
        for slot in map.owner.get_mut(start..=end.min(SLOTS - 1))? {
            *slot = i;
        }
    }
    map.settle();
    Some(map)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed() {
        let c = Cluster::parse("redis+cluster://u:p%40w@a:1,b:2", Dial::default()).unwrap();
        assert_eq!(c.seeds, [("a".to_string(), 1), ("b".to_string(), 2)]);
        assert_eq!(c.data.redis_settings().password(), Some("p@w"));
        for (url, says) in [
            ("redis+cluster://", "names no node"),
            ("redis+cluster://a", "host:port"),
            ("redis+cluster://u:secret@a:1/3", "one database"),
        ] {
            let err = Cluster::parse(url, Dial::default())
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn slot_replies_are_read() {
        use redis::Value::{Array, BulkString, Int};
        let node = |h: &str, p| Array(vec![BulkString(h.as_bytes().to_vec()), Int(p)]);
        let reply = Array(vec![
            Array(vec![
                Int(0),
                Int(8191),
                node("10.0.0.1", 7000),
                node("10.0.0.4", 7003),
            ]),
            Array(vec![Int(8192), Int(16383), node("", 7001)]),
        ]);
        let map = parse_slots(&reply, "10.0.0.2").unwrap();
        assert_eq!(map.uncovered(), 0);
        assert_eq!(map.owner_of(0), Some(("10.0.0.1".into(), 7000)));
        assert_eq!(map.owner_of(16383), Some(("10.0.0.2".into(), 7001)));
        let half = Array(vec![Array(vec![Int(0), Int(99), node("h", 1)])]);
        assert_eq!(parse_slots(&half, "x").unwrap().uncovered(), 16384 - 100);
    }
}
