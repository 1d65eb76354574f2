//! What a hold knows of other contenders for its lock: whether one may be waiting (what bounds
//! the local queue's handoffs and ends a linger), learned from one listing of the lock path
//! and the children watch it sets.

use std::sync::atomic::Ordering;

use tokio::sync::watch;

use super::monitor::{children_change, ChildrenChange};
use super::Hold;
use crate::backend::BoxFuture;

/// What a hold knows of other contenders for its lock (see [`Hold::others_waiting`]).
pub(super) enum Others {
    /// Nobody asked yet.
    Unasked,
    /// The listing that sets the children watch is in flight.
    Listing,
    /// The listing showed no other contender; the children watch it set completes on any
    /// change of the lock path's children (a new contender, or any doubt: the session ended).
    /// Shared: [`Hold::others_waiting`] polls it in passing, a lingering hold's task awaits it.
    NoneYet(ChildrenChange),
    /// Another contender exists or existed, or the listing failed: the bound applies.
    Maybe,
}

/// A hold's knowledge of other contenders, shared with the task that lists them.
pub(super) struct Contenders {
    pub(super) others: std::sync::Mutex<Others>,
    /// Bumped when the listing has answered (what [`Hold::confirmed`] waits for).
    pub(super) listed: watch::Sender<()>,
}

impl Hold {
    /// Whether another contender may be waiting for this lock: `true` unless a listing of the
    /// lock path, made on this hold's session, showed no other node and the children watch it
    /// set has not fired since. The first call starts that listing (one request) and answers
    /// `true`, as does any doubt. A watch's event reaches the client before the answer to any
    /// later request of its session, and is seen here without waiting.
    pub(super) fn others_waiting(&self) -> bool {
        if self.released.load(Ordering::SeqCst) || self.loss_reason().is_some() {
            return true;
        }
        let mut others = self.contenders.others.lock().unwrap();
        match &mut *others {
            Others::Unasked => {
                *others = Others::Listing;
                drop(others);
                self.list_contenders();
                true
            }
            Others::Listing | Others::Maybe => true,
            Others::NoneYet(changed) => {
                if futures::FutureExt::now_or_never(changed.clone()).is_some() {
                    *others = Others::Maybe;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// Completes once another contender may be waiting (see [`others_waiting`](Self::others_waiting)
    ///): at once if one is known or in doubt, else when the listing
    /// shows one or the children watch fires. Starts the listing if nobody asked yet.
    pub(super) fn others_appeared(&self) -> BoxFuture<'static, ()> {
        if self.released.load(Ordering::SeqCst) || self.loss_reason().is_some() {
            return Box::pin(std::future::ready(()));
        }
        let contenders = self.contenders.clone();
        // Subscribed before the state is read: a listing that answers after the read is seen.
        let mut listed = contenders.listed.subscribe();
        {
            let mut others = contenders.others.lock().unwrap();
            if matches!(*others, Others::Unasked) {
                *others = Others::Listing;
                drop(others);
                self.list_contenders();
            }
        }
        Box::pin(async move {
            loop {
                let fired = match &*contenders.others.lock().unwrap() {
                    Others::Listing => None,
                    Others::NoneYet(fired) => Some(fired.clone()),
                    Others::Unasked | Others::Maybe => return,
                };
                match fired {
                    Some(fired) => return fired.await,
                    None => {
                        if listed.changed().await.is_err() {
                            return;
                        }
                    }
                }
            }
        })
    }

    /// Lists the lock path's children and watches them (see [`others_waiting`](Self::others_waiting)
    ///).
    fn list_contenders(&self) {
        let Some((parent, name)) = self.node.rsplit_once('/') else {
            *self.contenders.others.lock().unwrap() = Others::Maybe;
            return;
        };
        let (parent, name) = (parent.to_string(), name.to_string());
        let client = self.session.client.clone();
        let contenders = self.contenders.clone();
        self.inner.count_requests(1);
        self.inner.runtime.spawn(async move {
            let next = match client.list_and_watch_children(&parent).await {
                Ok((children, watcher)) if children.iter().all(|c| *c == name) => {
                    Others::NoneYet(children_change(watcher))
                }
                _ => Others::Maybe,
            };
            let mut others = contenders.others.lock().unwrap();
            if matches!(*others, Others::Listing) {
                *others = next;
            }
            drop(others);
            contenders.listed.send_replace(());
        });
    }
}
