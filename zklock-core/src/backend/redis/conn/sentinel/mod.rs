//! Redis under Sentinel: `redis+sentinel://[user:password@]host:26379[,host:26379…]/<master
//! name>[/<db>]`. The Sentinels ([`Sentinels`]), asked for the primary for every new
//! connection (see [`Servers`](super::servers::Servers)); and (`failover.rs`) the [`watch`]
//! task that listens to the Sentinels for `+switch-master` and makes every hold lost to the
//! failover at once.
//!
//! What a failover does to holds (see `docs/backends/redis.md`): replication is asynchronous,
//! so the new primary may lack a lease or a token the old one granted. A hold is therefore
//! lost the moment this process learns of a failover, by whichever news comes first: the
//! Sentinels' `+switch-master`, a `-READONLY` reply (the server turned replica), or the break of
//! the connection (Sentinel kills the clients of a demoted primary). It is never confirmed on
//! the new primary: the guard reports [`LossReason::Failover`](crate::LossReason::Failover), and
//! the lock is taken again through a fresh acquire.
//!
//! Every connection to a data node asks `ROLE` first and is used only if the server says
//! `master`: a Sentinel's answer can be stale for a moment during a failover. And a connection
//! is used only if it goes to the primary this process trusts ([`Trusted`]: the newest naming
//! it has heard, by the Sentinels' configuration epoch) and no failover was acted on while it
//! was opened: a primary frozen past a failover still says `master` for seconds once woken,
//! and a connection opened to it before the failover comes up then.

mod failover;

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError,
    RedisResult,
};

use super::super::error::tls_failure;
use super::super::options::SentinelAuth;
use super::dial::Dial;
use crate::types::error::{Error, Result, ServerError};

pub(crate) use failover::watch;

/// The scheme of a Sentinel URL.
pub(crate) const SCHEME: &str = "redis+sentinel://";

/// What asking the Sentinels for the primary found, when it found no address.
#[derive(Debug)]
pub(crate) enum Asked {
    /// Every Sentinel that answered knows no master of that name.
    UnknownMaster,
    /// No Sentinel answered (the last error).
    NoSentinel(Option<RedisError>),
    /// The server at this address answered, but is no Sentinel (it knows no `SENTINEL`).
    NotSentinel(String),
    /// The Sentinel at this address asks for a password the manager was not given (`NOAUTH`),
    /// or refused the one it was given.
    Refused(String),
}

impl Asked {
    pub(crate) fn into_redis(self) -> RedisError {
        let text = match self {
            Asked::UnknownMaster => "no Sentinel knows the master name".to_string(),
            Asked::NoSentinel(Some(e)) => format!("no Sentinel answered: {e}"),
            Asked::NoSentinel(None) => "no Sentinel answered".to_string(),
            Asked::NotSentinel(addr) => format!("{addr} is not a Sentinel"),
            Asked::Refused(addr) => format!("the Sentinel at {addr} refused this client"),
        };
        RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, text))
    }
}

/// The Sentinels of one master, and how to reach the data nodes they name.
pub(crate) struct Sentinels {
    /// `host:port` of each Sentinel, as the URL gives them.
    addrs: Vec<(String, u16)>,
    /// The master's name in the Sentinels' configuration.
    pub(crate) master: String,
    /// The data nodes' connection settings (credentials, database); the address is the
    /// primary's, set per connection.
    data: ConnectionInfo,
    /// The Sentinels' connection settings (their own credentials, if any); the address is set
    /// per Sentinel.
    sentinel: ConnectionInfo,
    /// The primary this process trusts, and how many failovers it acted on.
    trusted: StdMutex<Trusted>,
    /// How the Sentinels and the data nodes are reached (TLS or not).
    pub(crate) dial: Dial,
    /// Told when a connection found the Sentinels naming a newer primary than the trusted one:
    /// [`watch`] asks them and acts on the failover.
    news: tokio::sync::Notify,
}

/// A primary as the Sentinels name it: its address and the configuration epoch of the naming
/// (every failover a Sentinel takes part in or hears of raises it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Named {
    pub(crate) addr: (String, u16),
    pub(crate) epoch: u64,
}

/// The primary this process trusts: the first one named, then each one it acted on as a
/// failover. Connections go only there.
#[derive(Debug, Default)]
struct Trusted {
    /// `None` before the first answer.
    named: Option<Named>,
    /// The failovers acted on; a connection opened across one is never used.
    failovers: u64,
}

/// How an answer of the Sentinels compares with the trusted primary.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    /// The trusted primary (or the first one named): connections may go there.
    Trusted,
    /// A newer primary: a failover this process has not acted on yet.
    Newer,
    /// An older naming than the one this process acted on (a Sentinel that has not heard of a
    /// failover yet): never connected to.
    Stale,
}

impl Trusted {
    /// Judges `named`, taking it as trusted if it is the first, or the trusted address under a
    /// newer epoch.
    fn judge(&mut self, named: &Named) -> Verdict {
        let Some(trusted) = &mut self.named else {
            self.named = Some(named.clone());
            return Verdict::Trusted;
        };
        match (named.addr == trusted.addr, named.epoch.cmp(&trusted.epoch)) {
            (true, ord) => {
                if ord.is_gt() {
                    trusted.epoch = named.epoch;
                }
                Verdict::Trusted
            }
            (false, std::cmp::Ordering::Greater) => Verdict::Newer,
            (false, _) => Verdict::Stale,
        }
    }

    /// Acts on `addr` as the primary, at `epoch` when known (an announcement carries none):
    /// `true` if that is a failover (another primary than the trusted one, and not an older
    /// naming), which is counted.
    fn act(&mut self, addr: (String, u16), epoch: Option<u64>) -> bool {
        let Some(trusted) = &mut self.named else {
            self.named = Some(Named {
                addr,
                epoch: epoch.unwrap_or(0),
            });
            return false;
        };
        if addr == trusted.addr {
            trusted.epoch = trusted.epoch.max(epoch.unwrap_or(0));
            return false;
        }
        if epoch.is_some_and(|e| e <= trusted.epoch) {
            return false;
        }
        trusted.addr = addr;
        trusted.epoch = epoch.unwrap_or(trusted.epoch);
        self.failovers += 1;
        true
    }
}

impl Sentinels {
    /// Parses `redis+sentinel://[user:password@]host:port[,host:port…]/<master>[/<db>]`; `auth`:
    /// the Sentinels' own credentials (see `RedisOptions::sentinel_password`).
    ///
    /// # Errors
    /// [`Error::Config`] naming what is wrong (never the password).
    pub(crate) fn parse(url: &str, auth: Option<&SentinelAuth>, dial: Dial) -> Result<Sentinels> {
        let rest = url
            .trim()
            .get(SCHEME.len()..)
            .filter(|_| url.trim().to_ascii_lowercase().starts_with(SCHEME))
            .ok_or_else(|| bad("it does not start with redis+sentinel://"))?;
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let addrs = parse_addrs(hosts)?;
        let mut segments = path.split('/').filter(|s| !s.is_empty());
        let master = segments
            .next()
            .map(percent_decode)
            .ok_or_else(|| bad("it names no master (the path's first segment)"))?;
        let db = match segments.next() {
            Some(db) => db
                .parse::<i64>()
                .map_err(|_| bad("the database after the master name is not a number"))?,
            None => 0,
        };
        if segments.next().is_some() {
            return Err(bad("the path has more than a master name and a database"));
        }
        // The data nodes' settings, from a `redis://` URL of the same credentials.
        let data_url = format!(
            "redis://{}127.0.0.1:6379/{db}",
            userinfo.map(|u| format!("{u}@")).unwrap_or_default()
        );
        let data = data_url
            .as_str()
            .into_connection_info()
            .map_err(|_| bad("the credentials are not usable"))?;
        let sentinel = sentinel_settings(auth)?;
        Ok(Sentinels {
            addrs,
            master,
            data,
            sentinel,
            trusted: StdMutex::default(),
            dial,
            news: tokio::sync::Notify::new(),
        })
    }

    /// The client of the data node at `host:port`, with the URL's credentials.
    pub(crate) fn data_client(&self, host: String, port: u16) -> RedisResult<Client> {
        Client::open(self.data.clone().set_addr(ConnectionAddr::Tcp(host, port)))
    }

    /// A client of Sentinel `i`.
    fn sentinel_client(&self, i: usize) -> RedisResult<Client> {
        let (host, port) = self.addrs[i].clone();
        Client::open(
            self.sentinel
                .clone()
                .set_addr(ConnectionAddr::Tcp(host, port)),
        )
    }

    /// Asks every Sentinel at once for the primary (`SENTINEL MASTER` for the configuration
    /// epoch, then `SENTINEL GET-MASTER-ADDR-BY-NAME`, in one round trip), each within
    /// `timeout`, and takes the newest naming: the highest epoch, and among the answers of that
    /// epoch the address most give (on a tie, the one of the Sentinel listed first).
    ///
    /// One Sentinel's word is not enough during a failover: a Sentinel that has not heard of
    /// it yet still names the old primary, under the old epoch, and the old primary keeps
    /// answering `master` until it is reconfigured; a connection opened to it would take locks
    /// the new primary knows nothing of.
    pub(crate) async fn primary(&self, timeout: Duration) -> std::result::Result<Named, Asked> {
        let asks = (0..self.addrs.len()).map(|i| async move {
            let asked = tokio::time::timeout(timeout, self.ask(i))
                .await
                .unwrap_or_else(|_| Err(super::super::error::timed_out()));
            (i, asked)
        });
        let answers = futures::future::join_all(asks).await;
        let mut unknown = false;
        let mut not_sentinel = None;
        let mut refused = None;
        let mut last_error = None;
        let mut votes: Vec<(Named, usize)> = Vec::new();
        for (i, asked) in answers {
            match asked {
                Ok(Some(named)) => match votes.iter_mut().find(|(n, _)| *n == named) {
                    Some((_, count)) => *count += 1,
                    None => votes.push((named, 1)),
                },
                Ok(None) => unknown = true,
                Err(e)
                    if e.to_string()
                        .to_ascii_lowercase()
                        .contains("unknown command") =>
                {
                    let (h, p) = &self.addrs[i];
                    not_sentinel = Some(format!("{h}:{p}"));
                }
                Err(e) if refused_credentials(&e) => {
                    let (h, p) = &self.addrs[i];
                    refused = Some(format!("{h}:{p}"));
                }
                // A TLS failure is kept over the others' errors: it is what the user must fix.
                Err(_)
                    if last_error
                        .as_ref()
                        .is_some_and(|l| tls_failure(l).is_some()) => {}
                Err(e) => last_error = Some(e),
            }
        }
        // The newest epoch; within it the most votes; among equals, the first given.
        let mut best: Option<(Named, usize)> = None;
        for (named, count) in votes {
            if best.as_ref().is_none_or(|(b, most)| {
                named.epoch > b.epoch || (named.epoch == b.epoch && count > *most)
            }) {
                best = Some((named, count));
            }
        }
        if let Some((named, _)) = best {
            return Ok(named);
        }
        Err(match (unknown, not_sentinel, refused) {
            (true, _, _) => Asked::UnknownMaster,
            (false, Some(addr), _) => Asked::NotSentinel(addr),
            (false, None, Some(addr)) => Asked::Refused(addr),
            (false, None, None) => Asked::NoSentinel(last_error),
        })
    }

    /// Asks Sentinel `i` for the master's configuration epoch and address, in this order and
    /// one round trip (a failover between them shows as an older epoch with the newer address,
    /// which is judged stale, never the reverse). `None`: it knows no master of that name.
    async fn ask(&self, i: usize) -> RedisResult<Option<Named>> {
        let mut c = self
            .dial
            .connection(&self.sentinel_client(i)?, &AsyncConnectionConfig::new())
            .await?;
        let asked = redis::pipe()
            .cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.master)
            .cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.master)
            .query_async::<(HashMap<String, String>, Option<(String, u16)>)>(&mut c)
            .await;
        let (master, addr) = match asked {
            Ok(answer) => answer,
            Err(e) if e.to_string().contains("No such master") => return Ok(None),
            Err(e) => return Err(e),
        };
        let epoch = master
            .get("config-epoch")
            .and_then(|e| e.parse::<u64>().ok())
            .ok_or_else(|| {
                RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "the Sentinel's SENTINEL MASTER reply has no config-epoch",
                ))
            })?;
        Ok(addr.map(|addr| Named { addr, epoch }))
    }

    /// Takes `named` (the answer at connect) as the trusted primary.
    pub(crate) fn trust(&self, named: &Named) {
        self.trusted.lock().unwrap().judge(named);
    }

    /// The primary to open a connection to now, and the failovers acted on so far (see
    /// [`Sentinels::still_trusted`]): the Sentinels' newest naming if it is the trusted one. A
    /// newer one is a failover this process has not acted on yet ([`watch`] is told, and acts);
    /// an older one a Sentinel that has not heard of the failover acted on: neither is
    /// connected to, and the request fails as on a broken connection.
    pub(crate) async fn trusted_primary(&self, timeout: Duration) -> RedisResult<(Named, u64)> {
        let named = self.primary(timeout).await.map_err(Asked::into_redis)?;
        let (verdict, failovers) = {
            let mut trusted = self.trusted.lock().unwrap();
            (trusted.judge(&named), trusted.failovers)
        };
        let why = match verdict {
            Verdict::Trusted => return Ok((named, failovers)),
            Verdict::Newer => {
                self.news.notify_one();
                "the Sentinels name a new primary: the failover is acted on first"
            }
            Verdict::Stale => {
                "the Sentinels that answered name the primary of before the last failover"
            }
        };
        Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            why,
        )))
    }

    /// Whether a connection opened to `addr` when `failovers` had been acted on may be used:
    /// no failover was acted on since, and `addr` is the trusted primary.
    pub(crate) fn still_trusted(&self, addr: &(String, u16), failovers: u64) -> bool {
        let trusted = self.trusted.lock().unwrap();
        trusted.failovers == failovers && trusted.named.as_ref().is_some_and(|n| n.addr == *addr)
    }

    /// What `primary` found, at connect, as the error a user reads: a Sentinel that failed
    /// TLS is [`Error::Tls`] naming it.
    pub(crate) fn connect_error(&self, asked: Asked, url: &str) -> Error {
        if let Asked::NoSentinel(Some(e)) = &asked {
            if let Some(failure) = tls_failure(e) {
                return failure;
            }
        }
        let sentinels: Vec<String> = self.addrs.iter().map(|(h, p)| format!("{h}:{p}")).collect();
        match asked {
            Asked::UnknownMaster => Error::Config(format!(
                "no Sentinel ({}) knows a master named {:?}: give the name the Sentinels monitor \
                 (SENTINEL MASTERS lists them)",
                sentinels.join(", "),
                self.master
            )),
            Asked::NotSentinel(addr) => Error::Config(format!(
                "the Redis Sentinel URL names {addr}, which answers but is not a Sentinel (it \
                 knows no SENTINEL command): give the Sentinels' addresses (port 26379 by \
                 default), or connect to a single server with redis://{addr}"
            )),
            Asked::Refused(addr) => Error::Config(format!(
                "the Sentinel at {addr} asks for a password this manager does not have, or \
                 refused the one it has: give the Sentinels' own password with \
                 .redis(|r| r.sentinel_password(..)) (and .sentinel_user(..) for an ACL user; \
                 the zklock tool's --sentinel-password); the URL's user:password@ are the data \
                 nodes'"
            )),
            asked @ Asked::NoSentinel(_) => {
                let e = asked.into_redis();
                Error::Unreachable {
                    connect: crate::types::error::redacted(url),
                    source: ServerError::new(
                        Arc::new(e.clone()),
                        format!("{e} (asked {})", sentinels.join(", ")),
                        true,
                        "check that the Sentinels run and that the addresses are Sentinels' \
                         (port 26379 by default), then retry",
                    ),
                }
            }
        }
    }
}

/// The error of a Sentinel URL that is not usable: `what` is wrong in it.
fn bad(what: &str) -> Error {
    Error::Config(format!(
        "the Redis Sentinel URL is not usable: {what}; give \
         redis+sentinel://[user:password@]host:26379[,host:26379...]/<master name>[/<db>]"
    ))
}

/// The Sentinels a URL's `host:port[,host:port…]` names (port 26379 when left out).
fn parse_addrs(hosts: &str) -> Result<Vec<(String, u16)>> {
    let mut addrs = Vec::new();
    for host in hosts.split(',').filter(|h| !h.is_empty()) {
        let (name, port) = match host.rsplit_once(':') {
            Some((n, p)) => (
                n,
                p.parse::<u16>()
                    .map_err(|_| bad(&format!("the port of the Sentinel {host:?}")))?,
            ),
            None => (host, 26379),
        };
        let name = name.trim_start_matches('[').trim_end_matches(']');
        if name.is_empty() {
            return Err(bad(&format!("the Sentinel {host:?} names no host")));
        }
        addrs.push((name.to_string(), port));
    }
    if addrs.is_empty() {
        return Err(bad("it names no Sentinel"));
    }
    Ok(addrs)
}

/// The Sentinels' own connection settings: their credentials, if given (`auth`).
fn sentinel_settings(auth: Option<&SentinelAuth>) -> Result<ConnectionInfo> {
    let mut sentinel = "redis://127.0.0.1:26379/0"
        .into_connection_info()
        .map_err(|_| bad("the Sentinels' settings"))?;
    if let Some(auth) = auth {
        let settings = sentinel
            .redis_settings()
            .clone()
            .set_password(auth.password.clone());
        let settings = match &auth.username {
            Some(user) => settings.set_username(user.clone()),
            None => settings,
        };
        sentinel = sentinel.set_redis_settings(settings);
    }
    Ok(sentinel)
}

/// Whether a Sentinel refused the client's credentials, or asked for some it was not given.
fn refused_credentials(e: &RedisError) -> bool {
    let text = e.to_string();
    matches!(e.kind(), redis::ErrorKind::AuthenticationFailed)
        || text.contains("NOAUTH")
        || text.contains("WRONGPASS")
}

/// Asks a fresh connection's server for its role: `Ok` only for a primary. A Sentinel's answer
/// can lag a failover, so the connection it led to is checked before any request uses it.
pub(crate) async fn check_primary(c: &mut MultiplexedConnection) -> RedisResult<()> {
    let role: Vec<redis::Value> = redis::cmd("ROLE").query_async(c).await?;
    match role.first() {
        Some(redis::Value::BulkString(b)) if b == b"master" => Ok(()),
        _ => Err(RedisError::from(std::io::Error::new(
            std::io::ErrorKind::NotConnected,
            "the server the Sentinels named is not a primary (a failover is under way)",
        ))),
    }
}

/// Decodes `%XX` escapes (a master name may hold characters a URL path cannot).
fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed() {
        let s =
            Sentinels::parse("redis+sentinel://a:1,b:2/mymaster", None, Dial::default()).unwrap();
        assert_eq!(s.addrs, [("a".to_string(), 1), ("b".to_string(), 2)]);
        assert_eq!(s.master, "mymaster");
        let s = Sentinels::parse(
            "REDIS+SENTINEL://u:p%40ss@h/my%20master/3",
            None,
            Dial::default(),
        )
        .unwrap();
        assert_eq!(s.addrs, [("h".to_string(), 26379)]);
        assert_eq!(s.master, "my master");
        assert_eq!(s.data.redis_settings().db(), 3);
        assert_eq!(s.data.redis_settings().password(), Some("p@ss"));
        // The Sentinels take their own credentials, not the data nodes'.
        assert_eq!(s.sentinel.redis_settings().password(), None);
        let auth = SentinelAuth {
            username: Some("locks".into()),
            password: "s3cret".into(),
        };
        let s =
            Sentinels::parse("redis+sentinel://u:pw@h/m", Some(&auth), Dial::default()).unwrap();
        assert_eq!(s.sentinel.redis_settings().password(), Some("s3cret"));
        assert_eq!(s.sentinel.redis_settings().username(), Some("locks"));
        assert_eq!(s.data.redis_settings().password(), Some("pw"));
        assert!(!format!("{auth:?}").contains("s3cret"));
    }

    #[test]
    fn a_naming_older_than_the_failover_acted_on_is_never_trusted() {
        let (a, b) = (("a".to_string(), 1), ("b".to_string(), 2));
        let named = |addr: &(String, u16), epoch| Named {
            addr: addr.clone(),
            epoch,
        };
        let mut trusted = Trusted::default();
        assert_eq!(
            trusted.judge(&named(&a, 3)),
            Verdict::Trusted,
            "the first answer"
        );
        assert_eq!(trusted.judge(&named(&b, 4)), Verdict::Newer);
        assert_eq!(trusted.judge(&named(&b, 3)), Verdict::Stale);
        assert!(
            !trusted.act(a.clone(), Some(4)),
            "the trusted primary: no failover"
        );
        // An announcement (no epoch) of another primary is a failover, counted.
        assert!(trusted.act(b.clone(), None));
        assert_eq!(trusted.failovers, 1);
        // A Sentinel that has not heard of it names the old primary under the old epoch.
        assert_eq!(trusted.judge(&named(&a, 4)), Verdict::Stale);
        assert!(
            !trusted.act(a.clone(), Some(4)),
            "an older naming is no failover"
        );
        // Once heard under a newer epoch, the trusted primary keeps its address.
        assert_eq!(trusted.judge(&named(&b, 5)), Verdict::Trusted);
        assert_eq!(trusted.judge(&named(&a, 5)), Verdict::Stale);
        // A failover back to the first primary, under a newer epoch still.
        assert_eq!(trusted.judge(&named(&a, 6)), Verdict::Newer);
        assert!(trusted.act(a.clone(), Some(6)));
        assert_eq!(trusted.failovers, 2);
        assert_eq!(trusted.named, Some(named(&a, 6)));
    }

    #[test]
    fn bad_urls_say_what_is_wrong_without_the_password() {
        for (url, says) in [
            ("redis+sentinel://h:1", "names no master"),
            ("redis+sentinel:///m", "names no Sentinel"),
            ("redis+sentinel://u:secret@h:x/m", "port"),
            ("redis+sentinel://h/m/x", "database"),
            ("redis+sentinel://h/m/1/2", "more than"),
        ] {
            let err = Sentinels::parse(url, None, Dial::default())
                .err()
                .unwrap()
                .to_string();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
