//! Waking waiters: one connection per backend `LISTEN`s on [`sql::CHANNEL`], which every
//! release notifies with the lock id; a waiter sleeps until its id is notified (or its
//! fallback pause passes: a holder whose session ended released without notifying).
//!
//! Waiters hold no connection and no server resource while they wait. When the listening
//! connection breaks, every waiter is woken (it may have missed a release) and the hub
//! connects again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tokio_postgres::{AsyncMessage, NoTls};

use super::conn::ConnConfig;
use super::sql;

/// Per lock id, a counter bumped by each release notified.
type Wakers = Arc<StdMutex<HashMap<i32, watch::Sender<u64>>>>;

/// The pause before connecting the listener again.
const RECONNECT_PAUSE: Duration = Duration::from_millis(200);

pub(crate) struct Hub {
    wakers: Wakers,
    task: AbortHandle,
}

impl Hub {
    /// Starts listening (in the background: waiters poll until it listens).
    pub(crate) fn start(cc: Arc<ConnConfig>) -> Hub {
        let wakers = Wakers::default();
        let task = cc
            .runtime
            .spawn(listen(cc.clone(), wakers.clone()))
            .abort_handle();
        Hub { wakers, task }
    }

    /// Starts listening for releases of `id`.
    pub(crate) fn listen(&self, id: i32) -> Listener {
        let rx = self
            .wakers
            .lock()
            .expect("not poisoned")
            .entry(id)
            .or_insert_with(|| watch::channel(0).0)
            .subscribe();
        Listener {
            rx,
            id,
            wakers: self.wakers.clone(),
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn wake(wakers: &Wakers, id: Option<i32>) {
    let wakers = wakers.lock().expect("not poisoned");
    match id {
        Some(id) => {
            if let Some(w) = wakers.get(&id) {
                w.send_modify(|n| *n += 1);
            }
        }
        None => wakers.values().for_each(|w| w.send_modify(|n| *n += 1)),
    }
}

/// Keeps a connection listening, and wakes waiters by the ids notified.
async fn listen(cc: Arc<ConnConfig>, wakers: Wakers) {
    loop {
        let connected = tokio::time::timeout(cc.connect_timeout, cc.config.connect(NoTls)).await;
        if let Ok(Ok((client, mut connection))) = connected {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            let listen = format!("LISTEN {}", sql::CHANNEL);
            let subscribe = client.batch_execute(&listen);
            tokio::pin!(subscribe);
            let mut listening = false;
            loop {
                tokio::select! {
                    done = &mut subscribe, if !listening => match done {
                        Ok(()) => {
                            listening = true;
                            // Releases before now were missed.
                            wake(&wakers, None);
                        }
                        Err(_) => break,
                    },
                    message = messages.next() => match message {
                        Some(Ok(AsyncMessage::Notification(n))) => {
                            wake(&wakers, n.payload().parse().ok());
                        }
                        Some(Ok(_)) => {}
                        Some(Err(_)) | None => break,
                    },
                }
            }
            tracing::debug!("zklock: the PostgreSQL listening connection ended; connecting again");
            wake(&wakers, None);
        }
        tokio::time::sleep(RECONNECT_PAUSE).await;
    }
}

/// A waiter's interest in one lock id's releases.
pub(crate) struct Listener {
    rx: watch::Receiver<u64>,
    id: i32,
    wakers: Wakers,
}

impl Listener {
    /// The lock id listened for.
    pub(crate) fn id(&self) -> i32 {
        self.id
    }

    /// Forgets the releases so far: call before each attempt.
    pub(crate) fn mark(&mut self) {
        self.rx.borrow_and_update();
    }

    /// Waits for a release since the last [`mark`](Self::mark), at most `fallback`.
    pub(crate) async fn wait(&mut self, fallback: Duration) {
        let _ = tokio::time::timeout(fallback, self.rx.changed()).await;
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut wakers = self.wakers.lock().expect("not poisoned");
        // This listener's receiver is the last one: nobody else waits for the id.
        if wakers
            .get(&self.id)
            .is_some_and(|w| w.receiver_count() <= 1)
        {
            wakers.remove(&self.id);
        }
    }
}
