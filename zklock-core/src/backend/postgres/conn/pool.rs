//! The backend's pool of holding connections: which connection an acquire, a hold or a
//! request that takes no lock gets ([`Pool`]), and what it reserved there ([`Reservation`],
//! [`Lent`]).

use std::collections::HashSet;
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use tokio::sync::Mutex as AsyncMutex;

use super::{ConnConfig, HoldConn};
use crate::backend::postgres::error::PostgresError;

/// Who uses a connection, kept together so that a connection is given to a wait in the
/// server's queue only while nothing else can send on it.
#[derive(Default)]
pub(super) struct Uses {
    /// Lock ids reserved on this connection by an acquire or a hold.
    pub(super) ids: HashSet<i32>,
    /// Requests that take no lock under way ([`Pool::any`]).
    pub(super) lent: usize,
    /// A wait in the server's lock queue runs on it: nothing else may be sent (it would wait
    /// behind the wait), so the pool hands it to nobody.
    pub(super) blocked: bool,
}

/// A lock id reserved on a connection; given back when dropped. Drop it only once the lock
/// is free on the connection (released, undone, never taken) or the connection is closed.
pub(crate) struct Reservation {
    pub(crate) conn: Arc<HoldConn>,
    pub(crate) id: i32,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.conn
            .uses
            .lock()
            .expect("not poisoned")
            .ids
            .remove(&self.id);
        self.conn.cc.freed.notify_waiters();
    }
}

/// A connection lent for requests that take no lock ([`Pool::any`]): it is not given to a
/// wait in the server's queue meanwhile.
pub(crate) struct Lent(Arc<HoldConn>);

impl std::ops::Deref for Lent {
    type Target = HoldConn;
    fn deref(&self) -> &HoldConn {
        &self.0
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        self.0.uses.lock().expect("not poisoned").lent -= 1;
        self.0.cc.freed.notify_waiters();
    }
}

/// The most holding connections a backend opens (beside its listening one): the bound on its
/// server connections, whatever its tasks do. Each acquire and hold of one lock id needs a
/// connection of its own (a session holds an advisory lock for all its statements), so this is
/// also how many of one process's acquires and holds of one lock id run at once: with the
/// local queue off, or readers (which each hold), the others wait in the process for a
/// connection. Different ids share connections.
pub(crate) const MAX_CONNECTIONS: usize = 16;

/// How often an acquire that waits for a connection of a full pool looks again without being
/// told (a connection that broke frees its place without a word).
const FULL_POLL: Duration = Duration::from_millis(100);

/// The backend's holding connections: as many as the most acquires and holds of one lock id
/// at a time in this process (one with the local queue), opened on demand, at most
/// [`MAX_CONNECTIONS`].
pub(crate) struct Pool {
    cc: Arc<ConnConfig>,
    conns: StdMutex<Vec<Arc<HoldConn>>>,
    /// One connection opens at a time.
    opening: AsyncMutex<()>,
}

impl Pool {
    pub(crate) fn new(cc: Arc<ConnConfig>) -> Pool {
        Pool {
            cc,
            conns: StdMutex::default(),
            opening: AsyncMutex::new(()),
        }
    }

    /// A live connection not given to a wait, taken as `need` says.
    fn find(&self, need: Need) -> Option<Arc<HoldConn>> {
        let mut conns = self.conns.lock().expect("not poisoned");
        conns.retain(|c| c.reason().is_none());
        conns.iter().find_map(|c| {
            let mut uses = c.uses.lock().expect("not poisoned");
            if uses.blocked {
                return None;
            }
            need.take(c, &mut uses).then(|| c.clone())
        })
    }

    /// A connection as `need` says: one that has it, else a new one while the pool is below
    /// [`MAX_CONNECTIONS`], else (`wait`) the first that has it once a use of one ends, or
    /// (not `wait`) none.
    async fn get(&self, need: Need, wait: bool) -> Result<Option<Arc<HoldConn>>, PostgresError> {
        // The common case, with nothing to listen for.
        if let Some(c) = self.find(need) {
            return Ok(Some(c));
        }
        loop {
            // Listening before looking: a use that ends after the look is not missed.
            let freed = self.cc.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            if let Some(c) = self.find(need) {
                return Ok(Some(c));
            }
            {
                let _turn = self.opening.lock().await;
                if let Some(c) = self.find(need) {
                    return Ok(Some(c));
                }
                if self.conns.lock().expect("not poisoned").len() < MAX_CONNECTIONS {
                    let c = HoldConn::open(&self.cc).await?;
                    need.take(&c, &mut c.uses.lock().expect("not poisoned"));
                    self.conns.lock().expect("not poisoned").push(c.clone());
                    return Ok(Some(c));
                }
            }
            if !wait {
                return Ok(None);
            }
            tokio::select! {
                _ = freed => {}
                _ = tokio::time::sleep(FULL_POLL) => {}
            }
        }
    }

    /// Reserves `id` on a live connection, opening one if every connection has it; when
    /// [`MAX_CONNECTIONS`] are open and all have it, waits until one does not.
    pub(crate) async fn reserve(&self, id: i32) -> Result<Reservation, PostgresError> {
        let conn = self
            .get(Need::Reserve(id), true)
            .await?
            .expect("waited for");
        Ok(Reservation { conn, id })
    }

    /// Reserves `id` on a live connection that nothing else uses, given to a wait in the
    /// server's queue (see [`HoldConn::try_block`]), opening one if there is none; none when
    /// [`MAX_CONNECTIONS`] are open and each is in use.
    pub(crate) async fn reserve_blocked(
        &self,
        id: i32,
    ) -> Result<Option<Reservation>, PostgresError> {
        let conn = self.get(Need::Block(id), false).await?;
        Ok(conn.map(|conn| Reservation { conn, id }))
    }

    /// A live connection, for requests that take no lock (key lookups, job records).
    pub(crate) async fn any(&self) -> Result<Lent, PostgresError> {
        let conn = self.get(Need::Lend, true).await?.expect("waited for");
        Ok(Lent(conn))
    }
}

/// What a caller of [`Pool::get`] takes of a connection.
#[derive(Clone, Copy)]
enum Need {
    /// A lock id, free on it.
    Reserve(i32),
    /// A lock id, on a connection nothing else uses, given to a wait.
    Block(i32),
    /// Requests that take no lock.
    Lend,
}

impl Need {
    /// Takes what is needed of `c` (whose `uses` are locked and not blocked), if it can.
    fn take(self, c: &HoldConn, uses: &mut Uses) -> bool {
        match self {
            Need::Reserve(id) => uses.ids.insert(id),
            Need::Block(id) => {
                if !uses.ids.is_empty() || uses.lent > 0 {
                    return false;
                }
                uses.ids.insert(id);
                uses.blocked = true;
                c.state.send_modify(|s| s.blocked = true);
                true
            }
            Need::Lend => {
                uses.lent += 1;
                true
            }
        }
    }
}
