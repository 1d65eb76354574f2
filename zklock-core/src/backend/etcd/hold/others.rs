//! What a mutex or write hold knows of other contenders for its lock: what bounds its local
//! handoffs and ends its linger (see [`BackendHold::others_waiting`](crate::backend::BackendHold::others_waiting)).
//!
//! Started by the first question, then kept for the hold's life: a watch of the lock's prefix
//! for a key put by anyone else, then a read of the keys under it created after the hold's own
//! (anyone there came after it, so waits for it), for what came before the watch. Until
//! the read is answered, and whenever the watch breaks, the answer is "maybe" (a contender may
//! be waiting), which never lingers.

use std::sync::Arc;

use etcd_client::{EventType, GetOptions, WatchFilterType, WatchOptions};

use super::super::session::Inner;
use crate::backend::others::OthersState;

/// The watch of one hold's lock for other contenders: the answer, and the task that finds it
/// out (a key put under the lock's prefix after the hold's).
pub(super) struct OthersWatch {
    pub(super) state: OthersState,
    task: tokio::task::AbortHandle,
}

impl OthersWatch {
    /// Starts watching the keys under `prefix` for one created after `rev` other than `own`.
    pub(super) fn start(inner: &Arc<Inner>, prefix: String, own: String, rev: i64) -> OthersWatch {
        let state = OthersState::new();
        let task = inner
            .runtime
            .spawn(watch_others(inner.clone(), state.clone(), prefix, own, rev))
            .abort_handle();
        OthersWatch { state, task }
    }
}

impl Drop for OthersWatch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn watch_others(
    inner: Arc<Inner>,
    state: OthersState,
    prefix: String,
    own: String,
    rev: i64,
) {
    let maybe = || state.maybe();
    // The watch first, from the server's current revision on (etcd catches up a watch that
    // starts in the past only every 100 ms), then a read for what came before it.
    let mut client = inner.client.clone();
    inner.count_request();
    let options = WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoDelete]);
    let Ok(Ok(mut stream)) = tokio::time::timeout(
        inner.config.reply_timeout,
        client.watch(prefix.as_str(), Some(options)),
    )
    .await
    else {
        return maybe();
    };
    let came = |resp: &etcd_client::WatchResponse| {
        resp.events().iter().any(|e| {
            e.event_type() == EventType::Put && e.kv().is_some_and(|kv| kv.key() != own.as_bytes())
        })
    };
    match stream.message().await {
        Ok(Some(resp)) if resp.created() && !came(&resp) => {}
        _ => return maybe(),
    }
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
    match read {
        Ok(Ok(got)) if got.kvs().is_empty() => state.nobody(),
        _ => return maybe(),
    }
    while let Ok(Some(resp)) = stream.message().await {
        if came(&resp) || resp.canceled() {
            return maybe();
        }
    }
    maybe()
}
