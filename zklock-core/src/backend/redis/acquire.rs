//! One acquire on the Redis backend, top-down: [`Acquire::run`] sends the attempt (a script
//! that takes the key or the shared set's members, or queues a mutex waiter), and turns its
//! answer into holds ([`Acquire::granted`]), a wait for a release or a hand-over
//! ([`Acquire::taken`]), or a retry ([`Acquire::failed`]). What an attempt may have left on the
//! server is undone by [`Unfinished`] when the acquire ends without a hold.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::conn::{server_error, transient};
use super::hold::{RedisHold, Side};
use super::hub::Listener;
use super::keys::Keys;
use super::{Ask, Attempt, Inner, RedisBackend, Undo, Unfinished};
use crate::backend::backoff::Backoff;
use crate::backend::LockTarget;
use crate::types::error::Result;
use crate::types::mode::Wait;
use crate::types::token::FencingToken;

/// What one attempt was sent under: what a grant or a refusal is judged by.
#[derive(Clone, Copy)]
struct Sent {
    /// The connections' break count then: a grant from before a break may predate a restart
    /// that lost it.
    epoch: u64,
    /// The hub's generation then (see `Hub::listen_direct_after`).
    hub_generation: u64,
    /// When it was sent: a lease counts from then.
    at: Instant,
}

/// What the acquire does after an attempt.
enum Next {
    Again,
    Done(Option<Vec<RedisHold>>),
}

/// One acquire of `n` holds of a lock (one but for a semaphore's leases), between its
/// attempts.
pub(super) struct Acquire<'a> {
    backend: &'a RedisBackend,
    target: &'a LockTarget,
    ask: Ask,
    n: u32,
    wait: Wait,
    keys: Arc<Keys>,
    /// The holder ids asked for, one per hold.
    ids: Vec<String>,
    /// A mutex waiter's place in the queue: `<hub id> <holder id>` (empty for the others).
    member: String,
    mutex: bool,
    /// Whether it waits (queues, for a mutex), or tries once.
    queue: bool,
    unfinished: Unfinished,
    /// A mutex waiter listens once refused (an acquire that is granted at once registers
    /// nothing); a hand-over or a connection event between its attempt and then is not
    /// missed (see `Hub::listen_direct_after`).
    listener: Option<Listener>,
    backoff: Backoff,
    /// Whether an attempt queued this mutex waiter (or may have: its reply was lost).
    queued: bool,
}

impl<'a> Acquire<'a> {
    pub(super) fn new(
        backend: &'a RedisBackend,
        target: &'a LockTarget,
        ask: Ask,
        n: u32,
        wait: Wait,
    ) -> Acquire<'a> {
        let inner = &backend.inner;
        let keys = inner.keys.get(&target.path);
        let ids: Vec<String> = (0..n.max(1)).map(|_| inner.new_id()).collect();
        let mutex = matches!(ask, Ask::Mutex);
        let member = if mutex {
            format!("{} {}", inner.hub.id, ids[0])
        } else {
            String::new()
        };
        let undo = if mutex {
            Undo::Mutex {
                id: ids[0].clone(),
                member: member.clone(),
            }
        } else {
            Undo::Any(ids.clone())
        };
        Acquire {
            backend,
            target,
            ask,
            n,
            wait,
            unfinished: Unfinished::new(inner.clone(), keys.clone(), undo),
            keys,
            ids,
            member,
            mutex,
            queue: !matches!(wait, Wait::Never),
            listener: None,
            backoff: Backoff::requests(),
            queued: false,
        }
    }

    fn inner(&self) -> &'a Arc<Inner> {
        &self.backend.inner
    }

    /// Acquires the holds, waiting as `wait` says. `None`: a try found the lock taken.
    pub(super) async fn run(mut self) -> Result<Option<Vec<RedisHold>>> {
        self.inner().undos.finished(&self.keys.exclusive).await;
        loop {
            if let Some(l) = &mut self.listener {
                l.mark();
            }
            self.unfinished.armed = true;
            let inner = self.inner();
            let sent = Sent {
                epoch: inner.breaks.epoch(),
                hub_generation: inner.hub.generation(),
                at: Instant::now(),
            };
            let attempt = self
                .backend
                .attempt(
                    &self.keys,
                    self.ask,
                    &self.ids,
                    &self.member,
                    self.queue,
                    self.queued,
                )
                .await;
            let next = match attempt {
                // A connection broke while the attempt was under way: the grant may predate a
                // restart that lost it. Asked again (idempotent for these ids): granted anew,
                // or refused.
                Ok(Attempt::Granted(_)) if inner.breaks.ended_since(sent.epoch, self.keys.slot) => {
                    self.queued = self.mutex && self.queue;
                    Next::Again
                }
                Ok(Attempt::Granted(last)) => Next::Done(Some(self.granted(last, sent))),
                Ok(Attempt::Taken(free_in, refused_at)) => {
                    self.taken(free_in, refused_at, sent).await
                }
                // Left armed: the grant is undone in the background.
                Ok(Attempt::Unacked(n)) => {
                    let what = "granted the lock (the grant is undone)";
                    return Err(super::unacked(inner.acks, n, what));
                }
                Err(e) => self.failed(e).await?,
            };
            if let Next::Done(holds) = next {
                return Ok(holds);
            }
        }
    }

    /// The holds of a granted attempt, `last` the last token handed out.
    fn granted(&mut self, last: i64, sent: Sent) -> Vec<RedisHold> {
        self.unfinished.armed = false;
        let first = last - i64::from(self.n.max(1)) + 1;
        let side = match self.ask {
            Ask::Mutex => Side::Mutex,
            Ask::Write => Side::Exclusive,
            Ask::Read | Ask::Leases { .. } => Side::Shared,
        };
        let inner = self.inner();
        (self.ids.iter().zip(first..))
            .map(|(id, token)| {
                let token = FencingToken::new(token, 0);
                self.hold(side, id, token, sent, inner.lease)
            })
            .collect()
    }

    fn hold(
        &self,
        side: Side,
        id: &str,
        token: FencingToken,
        sent: Sent,
        lease: Duration,
    ) -> RedisHold {
        let inner = self.inner();
        let key = self.target.key.clone();
        let keys = self.keys.clone();
        RedisHold::new(
            inner.clone(),
            keys,
            side,
            id.to_string(),
            key,
            token,
            sent.at,
            lease,
            sent.epoch,
        )
    }

    /// The lock is taken: nothing of ours is left but a waiting writer's intent or a queued
    /// mutex waiter's place. A try ends; a waiter listens for releases (first time: then tries
    /// again at once, a release may have come before), and waits for one, or for a hand-over.
    async fn taken(&mut self, free_in: Option<Duration>, refused_at: i64, sent: Sent) -> Next {
        self.backoff.reset();
        self.queued = self.mutex && self.queue;
        self.unfinished.armed = matches!(self.ask, Ask::Write) || (self.mutex && self.queue);
        if matches!(self.wait, Wait::Never) {
            return Next::Done(None);
        }
        let inner = self.inner();
        if self.listener.is_none() && self.mutex {
            self.listener = inner.hub.listen_direct_after(
                &self.keys.channel,
                &self.ids[0],
                sent.hub_generation,
            );
        }
        if self.listener.is_none() {
            let listener = inner.hub.listen(
                &self.keys.channel,
                self.mutex,
                self.mutex.then_some(self.ids[0].as_str()),
                inner.conn.reply_timeout,
            );
            self.listener = Some(listener.await);
            return Next::Again;
        }
        // Woken by a release, or when the lease in the way could run out (a millisecond late,
        // so that the server has let it go). A writer behind readers comes back every lease/3
        // to renew its intent; a queued mutex waiter every waiter TTL/3 to stay alive in the
        // queue (and to get in if the release's word to it was lost).
        let mut fallback = free_in.map_or(inner.lease, |d| d + Duration::from_millis(1));
        match self.ask {
            Ask::Write => fallback = fallback.min(inner.lease / 3),
            Ask::Mutex => fallback = fallback.min(inner.waiter_ttl / 3),
            Ask::Read | Ask::Leases { .. } => {}
        }
        let listener = self.listener.as_mut().expect("listening");
        listener.wait(fallback).await;
        match listener.take_grant() {
            Some(token) => self.handed_over(token, refused_at, sent),
            None => Next::Again,
        }
    }

    /// Handed the lock by a release with `token`? Only a hand-over made after the refused
    /// attempt was applied counts: its token is larger than the lock's last token at the
    /// refusal (`refused_at`). An older one (its word delayed past its short lease, which then
    /// ran out and someone else took the key) is void. The release set the key's expiry to the
    /// end of this waiter's liveness, which the refused attempt (sent at `sent`) set to its
    /// server time plus this waiter's own TTL: so the first lease runs until `sent` + waiter
    /// TTL at the earliest, whatever the releaser's lease. Too little of it left: the next
    /// attempt renews it instead. A connection break since: the next attempt finds out.
    fn handed_over(&mut self, token: i64, refused_at: i64, sent: Sent) -> Next {
        let inner = self.inner();
        let deadline = Inner::deadline_for(sent.at, inner.waiter_ttl);
        let in_time = deadline > Instant::now() + inner.waiter_ttl / 4;
        // With replica acknowledgements, the waiter's own attempt takes the key handed to it,
        // and that grant is what the replicas acknowledge.
        if token <= refused_at
            || !in_time
            || inner.breaks.ended_since(sent.epoch, self.keys.slot)
            || inner.acks.is_some()
        {
            return Next::Again;
        }
        self.unfinished.armed = false;
        let token = FencingToken::new(token, 0);
        let hold = self.hold(Side::Mutex, &self.ids[0], token, sent, inner.waiter_ttl);
        Next::Done(Some(vec![hold]))
    }

    /// The attempt failed: retried after a pause when the connection failed, the acquire's
    /// error otherwise.
    async fn failed(&mut self, e: redis::RedisError) -> Result<Next> {
        if !transient(&e) {
            return Err(server_error("acquire the lock", e));
        }
        self.queued = self.mutex && self.queue;
        tracing::debug!(key = %self.target.key, error = %e, "zklock: a Redis acquire attempt failed; retrying");
        self.backoff.wait().await;
        Ok(Next::Again)
    }
}
