//! The watch for failovers under Sentinel: the task that listens to the Sentinels for
//! `+switch-master` and makes every hold lost to the failover at once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use futures::StreamExt;
use redis::{RedisError, RedisResult};

use super::super::Inner;
use super::Sentinels;
use crate::backend::backoff::Backoff;

/// The shortest pause before listening to the next Sentinel after one broke or refused.
const LISTEN_RETRY_MIN: Duration = Duration::from_millis(100);
/// The longest.
const LISTEN_RETRY_MAX: Duration = Duration::from_secs(2);

/// The task that listens to the Sentinels for `+switch-master` of this master, one
/// subscription per Sentinel (each subscribed again once it breaks), for as long as the
/// backend lives. On each announcement of another primary than the trusted one, whenever a
/// listener (re)subscribes and finds the Sentinels naming a newer one, and whenever a new
/// connection found them naming a newer one, it makes every hold lost to the failover and
/// drops the command and pub/sub connections, so that the next request asks the Sentinels
/// again.
///
/// It ends when `stop` does: its sender lives in the backend, so the task and its Sentinel
/// connections end with the backend.
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
    // Asking the Sentinels again once the first subscription is up covers the time since
    // connect for every listener; a listener that subscribes again asks for itself.
    let first = Arc::new(AtomicBool::new(true));
    let each = (0..sentinels.addrs.len()).map(|i| {
        let (sentinels, inner) = (sentinels.clone(), inner.clone());
        let first = first.clone();
        async move {
            let mut backoff = Backoff::new(LISTEN_RETRY_MIN, LISTEN_RETRY_MAX);
            let mut again = false;
            loop {
                let ask = again || first.swap(false, Ordering::SeqCst);
                again = true;
                match listen(&sentinels, i, &inner, timeout, ask).await {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::debug!(error = %e, sentinel = i, "zklock: lost a Redis Sentinel subscription; subscribing again");
                    }
                }
                backoff.wait().await;
            }
        }
    });
    // A connection found the Sentinels naming a newer primary: ask them, and act on it.
    let news = async {
        loop {
            sentinels.news.notified().await;
            if let Ok(named) = sentinels.primary(timeout).await {
                if !switch(&sentinels, &inner, named.addr, Some(named.epoch)) {
                    return;
                }
            }
        }
    };
    tokio::select! {
        _ = &mut stop => {}
        _ = futures::future::join_all(each) => {}
        _ = news => {}
    }
}

/// Subscribes to Sentinel `i`'s `+switch-master` and acts on each announcement of this
/// master's primary until the subscription breaks (`Err`) or the backend is gone (`Ok`). Once
/// subscribed, `ask`s the Sentinels for the primary, for a failover announced while nothing
/// listened.
async fn listen(
    sentinels: &Sentinels,
    i: usize,
    inner: &Weak<Inner>,
    timeout: Duration,
    ask: bool,
) -> RedisResult<()> {
    let client = sentinels.sentinel_client(i)?;
    let mut pubsub = tokio::time::timeout(timeout, async {
        let mut p = sentinels.dial.pubsub(&client).await?;
        p.subscribe("+switch-master").await?;
        Ok::<_, RedisError>(p)
    })
    .await
    .map_err(|_| super::super::super::error::timed_out())??;
    if ask {
        if let Ok(named) = sentinels.primary(timeout).await {
            if !switch(sentinels, inner, named.addr, Some(named.epoch)) {
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
                if !switch(sentinels, inner, now, None) {
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

/// Acts on `now` as the primary (named at `epoch`, when known): if it is a failover (see
/// `Trusted::act`), every hold of the backend is lost to it and its connections are dropped.
/// `false` once the backend is gone.
fn switch(
    sentinels: &Sentinels,
    inner: &Weak<Inner>,
    now: (String, u16),
    epoch: Option<u64>,
) -> bool {
    // Counted before the connections are dropped (under their map's lock): a connection
    // opened across it is either dropped with them or refused when it comes up.
    if !sentinels.trusted.lock().unwrap().act(now.clone(), epoch) {
        return inner.strong_count() > 0;
    }
    let Some(inner) = inner.upgrade() else {
        return false;
    };
    tracing::warn!(primary = %format!("{}:{}", now.0, now.1), "zklock: Redis failed over to a new primary (Sentinel); every hold is lost");
    inner.conn.failed_over_at(None);
    inner.hub.reconnect();
    true
}
