//! Redis under Sentinel: `redis+sentinel://[user:password@]host:26379[,host:26379…]/<master
//! name>[/<db>]`. The Sentinels ([`Sentinels`]), asked for the primary for every new
//! connection (see [`Servers`](super::servers::Servers)); and the [`watch`] task that listens to the Sentinels for `+switch-master` and makes every
//! hold lost to the failover at once.
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
//! `master`: a Sentinel's answer can be stale for a moment during a failover.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::aio::MultiplexedConnection;
use redis::{Client, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, RedisError, RedisResult};

use super::options::SentinelAuth;
use super::Inner;
use crate::types::error::{Error, Result, ServerError};

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
    /// The primary's address as last asked, for the logs and [`watch`].
    pub(crate) primary: StdMutex<Option<(String, u16)>>,
}

impl Sentinels {
    /// Parses `redis+sentinel://[user:password@]host:port[,host:port…]/<master>[/<db>]`; `auth`:
    /// the Sentinels' own credentials (see `RedisOptions::sentinel_password`).
    ///
    /// # Errors
    /// [`Error::Config`] naming what is wrong (never the password).
    pub(crate) fn parse(url: &str, auth: Option<&SentinelAuth>) -> Result<Sentinels> {
        let bad = |what: &str| {
            Error::Config(format!(
                "the Redis Sentinel URL is not usable: {what}; give \
                 redis+sentinel://[user:password@]host:26379[,host:26379...]/<master name>[/<db>]"
            ))
        };
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
        Ok(Sentinels {
            addrs,
            master,
            data,
            sentinel,
            primary: StdMutex::new(None),
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

    /// Asks every Sentinel at once for the primary's address (`SENTINEL
    /// GET-MASTER-ADDR-BY-NAME`), each within `timeout`, and takes the address most of those
    /// that answered give (on a tie, the one the Sentinel that answered first gives).
    ///
    /// One Sentinel's word is not enough during a failover: a Sentinel that has not heard of
    /// it yet still names the old primary, which keeps answering `master` until it is
    /// reconfigured, and a connection opened to it would take locks the new primary knows
    /// nothing of.
    pub(crate) async fn primary(
        &self,
        timeout: Duration,
    ) -> std::result::Result<(String, u16), Asked> {
        let asks = (0..self.addrs.len()).map(|i| async move {
            let asked = tokio::time::timeout(timeout, async {
                let mut c = self
                    .sentinel_client(i)?
                    .get_multiplexed_async_connection()
                    .await?;
                redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.master)
                    .query_async::<Option<(String, u16)>>(&mut c)
                    .await
            })
            .await
            .unwrap_or_else(|_| Err(super::wire::timed_out()));
            (i, asked)
        });
        let answers = futures::future::join_all(asks).await;
        let mut unknown = false;
        let mut not_sentinel = None;
        let mut refused = None;
        let mut last_error = None;
        let mut votes: Vec<((String, u16), usize)> = Vec::new();
        for (i, asked) in answers {
            match asked {
                Ok(Some(addr)) => match votes.iter_mut().find(|(a, _)| *a == addr) {
                    Some((_, n)) => *n += 1,
                    None => votes.push((addr, 1)),
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
                Err(e) => last_error = Some(e),
            }
        }
        // The most votes; among equals, the first given.
        let mut best: Option<((String, u16), usize)> = None;
        for (addr, n) in votes {
            if best.as_ref().is_none_or(|(_, m)| n > *m) {
                best = Some((addr, n));
            }
        }
        if let Some((addr, _)) = best {
            *self.primary.lock().unwrap() = Some(addr.clone());
            return Ok(addr);
        }
        Err(match (unknown, not_sentinel, refused) {
            (true, _, _) => Asked::UnknownMaster,
            (false, Some(addr), _) => Asked::NotSentinel(addr),
            (false, None, Some(addr)) => Asked::Refused(addr),
            (false, None, None) => Asked::NoSentinel(last_error),
        })
    }

    /// What `primary` found, at connect, as the error a user reads.
    pub(crate) fn connect_error(&self, asked: Asked, url: &str) -> Error {
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

/// The shortest pause before listening to the next Sentinel after one broke or refused.
const RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest.
const RETRY_MAX: Duration = Duration::from_secs(2);

/// The task that listens to the Sentinels for `+switch-master` of this master, one Sentinel at
/// a time (the next once one breaks), for as long as the backend lives. On each announcement,
/// and whenever it (re)subscribes and finds the primary moved from the one the connections
/// were opened to, it makes every hold lost to the failover and drops the command and pub/sub
/// connections, so that the next request asks the Sentinels again.
///
/// It ends when `stop` does: its sender lives in the backend, so the task and its Sentinel
/// connection end with the backend.
pub(crate) async fn watch(
    sentinels: Arc<Sentinels>,
    inner: Weak<Inner>,
    timeout: Duration,
    mut stop: tokio::sync::oneshot::Receiver<()>,
) {
    // Every Sentinel at once: the one that runs a failover announces `+switch-master` only
    // once it has reconfigured the replicas (a second or more after the promotion), the others
    // as soon as they hear of the new primary; a process listening to the first alone would
    // keep granting on the old primary, still a primary, while others grant on the new one.
    let acted = Arc::new(tokio::sync::Mutex::new(
        sentinels.primary.lock().unwrap().clone(),
    ));
    // Asking the Sentinels again once the first subscription is up covers the time since
    // connect for every listener; a listener that subscribes again asks for itself.
    let first = Arc::new(AtomicBool::new(true));
    let each = (0..sentinels.addrs.len()).map(|i| {
        let (sentinels, inner, acted) = (sentinels.clone(), inner.clone(), acted.clone());
        let first = first.clone();
        async move {
            let mut pause = RETRY_MIN;
            let mut again = false;
            loop {
                let ask = again || first.swap(false, Ordering::SeqCst);
                again = true;
                match listen(&sentinels, i, &inner, timeout, &acted, ask).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, sentinel = i, "zklock: lost a Redis Sentinel subscription; subscribing again");
                    }
                }
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(RETRY_MAX);
            }
        }
    });
    tokio::select! {
        _ = &mut stop => {}
        _ = futures::future::join_all(each) => {}
    }
}

/// Subscribes to Sentinel `i`'s `+switch-master` and acts on each announcement of a primary
/// other than the last one acted on (`acted`, shared by the listeners of every Sentinel, so a
/// failover is acted on once however many Sentinels announce it) until the subscription breaks
/// (`Err`) or the backend is gone (`Ok`). Once subscribed, `ask`s the Sentinels for the
/// primary, for an announcement made while nothing listened.
async fn listen(
    sentinels: &Sentinels,
    i: usize,
    inner: &Weak<Inner>,
    timeout: Duration,
    acted: &tokio::sync::Mutex<Option<(String, u16)>>,
    ask: bool,
) -> RedisResult<()> {
    let client = sentinels.sentinel_client(i)?;
    let mut pubsub = tokio::time::timeout(timeout, async {
        let mut p = client.get_async_pubsub().await?;
        p.subscribe("+switch-master").await?;
        Ok::<_, RedisError>(p)
    })
    .await
    .map_err(|_| super::wire::timed_out())??;
    // A failover this process missed while it listened nowhere: the Sentinel names another
    // primary than the one acted on last.
    if ask {
        if let Ok(now) = sentinels.primary(timeout).await {
            if !switch(inner, acted, now).await {
                return Ok(());
            }
        }
    }
    let mut messages = pubsub.on_message();
    while let Some(message) = messages.next().await {
        let Ok(payload) = message.get_payload::<String>() else {
            continue;
        };
        // `<master name> <old ip> <old port> <new ip> <new port>`
        let words: Vec<&str> = payload.split(' ').collect();
        if let [name, _, _, host, port] = words[..] {
            if name == sentinels.master {
                let now = (host.to_string(), port.parse().unwrap_or(0));
                *sentinels.primary.lock().unwrap() = Some(now.clone());
                if !switch(inner, acted, now).await {
                    return Ok(());
                }
            }
        }
    }
    Err(RedisError::from(std::io::Error::new(
        std::io::ErrorKind::ConnectionReset,
        "the Sentinel's connection ended",
    )))
}

/// Acts on `now` as the primary if it is not the one acted on last: every hold is lost to the
/// failover. `false` once the backend is gone.
async fn switch(
    inner: &Weak<Inner>,
    acted: &tokio::sync::Mutex<Option<(String, u16)>>,
    now: (String, u16),
) -> bool {
    let mut acted = acted.lock().await;
    if acted.as_ref() == Some(&now) {
        return inner.strong_count() > 0;
    }
    let known = acted.replace(now.clone());
    // The first answer (no primary known yet) is no failover.
    if known.is_none() {
        return inner.strong_count() > 0;
    }
    failed_over(inner, &now).await
}

/// Makes every hold of the backend lost to a failover to `primary`, and drops its connections.
/// `false` once the backend is gone.
async fn failed_over(inner: &Weak<Inner>, primary: &(String, u16)) -> bool {
    let Some(inner) = inner.upgrade() else {
        return false;
    };
    tracing::warn!(primary = %format!("{}:{}", primary.0, primary.1), "zklock: Redis failed over to a new primary (Sentinel); every hold is lost");
    inner.conn.failed_over_at(None);
    inner.hub.reconnect();
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_parsed() {
        let s = Sentinels::parse("redis+sentinel://a:1,b:2/mymaster", None).unwrap();
        assert_eq!(s.addrs, [("a".to_string(), 1), ("b".to_string(), 2)]);
        assert_eq!(s.master, "mymaster");
        let s = Sentinels::parse("REDIS+SENTINEL://u:p%40ss@h/my%20master/3", None).unwrap();
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
        let s = Sentinels::parse("redis+sentinel://u:pw@h/m", Some(&auth)).unwrap();
        assert_eq!(s.sentinel.redis_settings().password(), Some("s3cret"));
        assert_eq!(s.sentinel.redis_settings().username(), Some("locks"));
        assert_eq!(s.data.redis_settings().password(), Some("pw"));
        assert!(!format!("{auth:?}").contains("s3cret"));
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
            let err = Sentinels::parse(url, None).err().unwrap().to_string();
            assert!(err.contains(says), "{url}: {err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }
}
