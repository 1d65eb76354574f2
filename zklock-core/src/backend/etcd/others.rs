//! What a mutex or write hold knows of other contenders for its lock: what bounds its local
//! handoffs and ends its linger (see [`BackendHold::others_waiting`](crate::backend::BackendHold::others_waiting)).
//!
//! Started by the first question, then kept for the hold's life: a read of the keys under the
//! lock's prefix created after the hold's own (anyone there came after it, so waits for it),
//! then a watch of the prefix from the read's revision on for a key put by anyone else. Until
//! the read is answered, and whenever the watch breaks, the answer is "maybe" (a contender may
//! be waiting), which never lingers.

use std::sync::Arc;

use etcd_client::{EventType, GetOptions, WatchFilterType, WatchOptions};
use tokio::sync::watch;

use super::Inner;

/// Whether another contender may be waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Others {
    /// Not known yet: the read is under way.
    Unknown,
    /// None came after the hold, as far as the watch has seen.
    Nobody,
    /// One came, or may have (the watch broke).
    Maybe,
}

/// The watch of one hold's lock for other contenders.
pub(crate) struct OthersWatch {
    state: watch::Sender<Others>,
    task: tokio::task::AbortHandle,
}

impl OthersWatch {
    /// Starts watching the keys under `prefix` for one created after `rev` other than `own`.
    pub(crate) fn start(inner: &Arc<Inner>, prefix: String, own: String, rev: i64) -> OthersWatch {
        let state = watch::Sender::new(Others::Unknown);
        let task = inner
            .runtime
            .spawn(watch_others(inner.clone(), state.clone(), prefix, own, rev))
            .abort_handle();
        OthersWatch { state, task }
    }

    /// Gives up on an answer: "maybe".
    pub(crate) fn state_maybe(&self) {
        self.state.send_replace(Others::Maybe);
    }

    pub(crate) fn now(&self) -> Others {
        *self.state.borrow()
    }

    /// Completes once the answer is known (or is "maybe").
    pub(crate) async fn known(&self) {
        let mut rx = self.state.subscribe();
        let _ = rx.wait_for(|o| *o != Others::Unknown).await;
    }

    /// Completes once another contender may be waiting.
    pub(crate) fn appeared(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.state.subscribe();
        async move {
            let _ = rx.wait_for(|o| *o == Others::Maybe).await;
        }
    }
}

impl Drop for OthersWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn watch_others(
    inner: Arc<Inner>,
    state: watch::Sender<Others>,
    prefix: String,
    own: String,
    rev: i64,
) {
    let maybe = || {
        state.send_replace(Others::Maybe);
    };
    let mut client = inner.client.clone();
    inner.count_request();
    let read = tokio::time::timeout(
        inner.config.reply_timeout,
        client.get(
            prefix.as_str(),
            Some(
                GetOptions::new()
                    .with_prefix()
                    .with_keys_only()
                    .with_limit(1)
                    .with_min_create_revision(rev + 1),
            ),
        ),
    )
    .await;
    let seen = match read {
        Ok(Ok(got)) if got.kvs().is_empty() => got.header().map_or(rev, |h| h.revision()),
        _ => return maybe(),
    };
    let options = WatchOptions::new()
        .with_prefix()
        .with_start_revision(seen + 1)
        .with_filters([WatchFilterType::NoDelete]);
    let Ok(Ok(mut stream)) = tokio::time::timeout(
        inner.config.reply_timeout,
        client.watch(prefix.as_str(), Some(options)),
    )
    .await
    else {
        return maybe();
    };
    // Watching from the read's revision on: nobody so far.
    state.send_replace(Others::Nobody);
    while let Ok(Some(resp)) = stream.message().await {
        let came = resp.events().iter().any(|e| {
            e.event_type() == EventType::Put && e.kv().is_some_and(|kv| kv.key() != own.as_bytes())
        });
        if came || resp.canceled() {
            return maybe();
        }
    }
    maybe()
}
