//! One acquire on the Redis backend, top-down, as the acquire driver runs it:
//! [`Acquire::attempt`] sends the attempt (a script that takes the key or the shared set's
//! members, or queues a mutex waiter), and turns its answer into holds
//! ([`Acquire::granted`]), a refusal ([`Acquire::taken`]) that a waiter waits on for a release
//! or a hand-over ([`Acquire::wait`]), or a retry ([`Acquire::failed`]). What an attempt may
//! have left on the server is undone by [`Unfinished`] when the acquire ends without a hold.
//!
//! Waiters do not poll. A mutex's waiting processes queue in `zklock:queue:<path>`; a release
//! reserves the key for the first live one and tells only it, on that process's own channel.
//! Readers, writers and semaphore leases listen on the lock's channel `zklock:wake:<path>`,
//! which their releases publish to. Either way a waiter also wakes when the lease in its way
//! could run out (its `PTTL`), and a queued one every [`waiter TTL`](super::conn::waiter_ttl)/3
//! to stay alive in the queue. See [`hub`](super::conn::hub).
//!
//! Order: a mutex (and a leader latch) goes to waiting processes first come, first served: by
//! the server time of their first refused attempt; a process that asks while others wait joins
//! the back of the queue (a release hands the key on, reserved, to the first waiter). A waiter
//! whose process died or was cut off drops out once its liveness (a [`waiter
//! TTL`](super::conn::waiter_ttl), refreshed by every attempt) runs out, and a reservation for
//! it ends after one TTL, so it holds the others up for about that long at most; after a
//! reservation ran out, whoever asks first gets the key. Within a process, the local queue
//! keeps tasks in order, with one task per process waiting on Redis.
//!
//! Readers, writers and semaphore leases keep no order among processes: a release wakes every
//! process waiting for the lock, and the first to ask gets it. A waiting writer makes new
//! readers wait (writers are not starved by readers): it leaves an intent key, renewed every
//! lease/3 while it waits.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::conn::hub::Listener;
use super::conn::lease::Side;
use super::conn::Inner;
use super::error::{server_error, transient, unacked};
use super::hold::{RedisHold, Undo, Unfinished};
use super::wire::keys::{self, Keys};
use super::wire::scripts;
use crate::backend::backoff::Backoff;
use crate::backend::undos::Undos;
use crate::backend::{Acquisition, BoxFuture, LockTarget, SharedHold, Step};
use crate::types::error::Result;
use crate::types::mode::{LockMode, Wait};
use crate::types::token::FencingToken;

/// Which of this backend's acquire scripts an acquire runs (see [`scripts`]), and with what:
/// the Redis form of what the seam asks ([`LockMode`], converted below, or a semaphore's
/// leases). Which key a granted hold then lives in is its [`Side`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Ask {
    /// The exclusive key, for a mutex or a leader latch: queued first come, first served.
    Mutex,
    /// The exclusive key, for a writer: readers exclude it too.
    Write,
    /// A read hold.
    Read,
    /// Leases of a semaphore with `max` leases.
    Leases { max: u32 },
}

impl From<LockMode> for Ask {
    fn from(mode: LockMode) -> Ask {
        match mode {
            // A leader latch is exclusive; Redis keeps no participant ids.
            LockMode::Exclusive | LockMode::Leader => Ask::Mutex,
            LockMode::Write => Ask::Write,
            LockMode::Read => Ask::Read,
        }
    }
}

/// What an attempt found.
enum Attempt {
    /// Granted, with the last token handed out.
    Granted(i64),
    /// Taken: how long until it may be free (`None`: no expiry to wait for), and (a mutex) the
    /// lock's last token when the attempt was refused: a hand-over announced with a token no
    /// larger was made before the refusal, and is void.
    Taken(Option<Duration>, i64),
    /// Granted, but fewer replicas than [`RedisOptions::replica_acks`](super::RedisOptions::replica_acks) asks acknowledged it
    /// in time (how many did): it does not count, and is undone.
    Unacked(i64),
}

impl Attempt {
    /// What an acquire script's reply says: `{1, token}` granted; else `{0, ms}` taken, `ms`
    /// how long until it may be free (negative: no expiry to wait for), with the lock's last
    /// token third for a mutex (0 when absent).
    fn of_reply(reply: &[i64]) -> Attempt {
        let fence = reply.get(2).copied().unwrap_or(0);
        match reply {
            [1, token, ..] => Attempt::Granted(*token),
            [_, ms, ..] if *ms >= 0 => {
                Attempt::Taken(Some(Duration::from_millis(*ms as u64)), fence)
            }
            _ => Attempt::Taken(None, fence),
        }
    }
}
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

/// What a refused attempt found, for the wait that follows.
#[derive(Clone, Copy)]
struct Refused {
    /// How long until the lock may be free (`None`: no expiry to wait for).
    free_in: Option<Duration>,
    /// A mutex's last token at the refusal.
    refused_at: i64,
    sent: Sent,
}

/// One acquire of `n` holds of a lock (one but for a semaphore's leases), between its
/// attempts.
pub(super) struct Acquire<'a> {
    inner: &'a Arc<Inner>,
    target: &'a LockTarget,
    ask: Ask,
    n: u32,
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
    /// The last attempt's refusal, for the wait.
    refused: Option<Refused>,
}

impl<'a> Acquire<'a> {
    pub(super) fn new(
        inner: &'a Arc<Inner>,
        target: &'a LockTarget,
        ask: Ask,
        n: u32,
        wait: Wait,
    ) -> Acquire<'a> {
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
            inner,
            target,
            ask,
            n,
            unfinished: Unfinished::new(inner.clone(), keys.clone(), undo),
            keys,
            ids,
            member,
            mutex,
            queue: !matches!(wait, Wait::Never),
            listener: None,
            backoff: Backoff::requests(),
            queued: false,
            refused: None,
        }
    }

    fn inner(&self) -> &'a Arc<Inner> {
        self.inner
    }

    /// One attempt: granted, refused (the wait follows), or again after a failure.
    async fn attempt(&mut self) -> Result<Step> {
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
        let attempt = inner
            .attempt(
                &self.keys,
                self.ask,
                &self.ids,
                &self.member,
                self.queue,
                self.queued,
            )
            .await;
        Ok(match attempt {
            // A connection broke while the attempt was under way: the grant may predate a
            // restart that lost it. Asked again (idempotent for these ids): granted anew, or
            // refused.
            Ok(Attempt::Granted(_)) if inner.breaks.ended_since(sent.epoch, self.keys.slot) => {
                self.queued = self.mutex && self.queue;
                Step::Again
            }
            Ok(Attempt::Granted(last)) => held(self.granted(last, sent)),
            Ok(Attempt::Taken(free_in, refused_at)) => {
                self.taken(Refused {
                    free_in,
                    refused_at,
                    sent,
                });
                Step::Busy
            }
            // Left armed: the grant is undone in the background.
            Ok(Attempt::Unacked(n)) => {
                let what = "granted the lock (the grant is undone)";
                return Err(unacked(inner.acks, n, what));
            }
            Err(e) => self.failed(e).await?,
        })
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
    /// mutex waiter's place. A try ends; a waiter waits (see [`wait`](Self::wait)).
    fn taken(&mut self, refused: Refused) {
        self.backoff.reset();
        self.queued = self.mutex && self.queue;
        self.unfinished.armed = matches!(self.ask, Ask::Write) || (self.mutex && self.queue);
        self.refused = Some(refused);
    }

    /// After a refusal: listens for releases (first time: then tries again at once, a release
    /// may have come before), and waits for one, or for a hand-over.
    async fn wait(&mut self) -> Step {
        let Refused {
            free_in,
            refused_at,
            sent,
        } = self.refused.take().expect("refused");
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
            return Step::Again;
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
            None => Step::Again,
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
    fn handed_over(&mut self, token: i64, refused_at: i64, sent: Sent) -> Step {
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
            return Step::Again;
        }
        self.unfinished.armed = false;
        let token = FencingToken::new(token, 0);
        let hold = self.hold(Side::Mutex, &self.ids[0], token, sent, inner.waiter_ttl);
        held(vec![hold])
    }

    /// The attempt failed: retried after a pause when the connection failed, the acquire's
    /// error otherwise.
    async fn failed(&mut self, e: redis::RedisError) -> Result<Step> {
        if !transient(&e) {
            return Err(server_error("acquire the lock", e));
        }
        self.queued = self.mutex && self.queue;
        tracing::debug!(key = %self.target.key, error = %e, "zklock: a Redis acquire attempt failed; retrying");
        self.backoff.wait().await;
        Ok(Step::Again)
    }
}

/// The driver's step of granted `holds`.
fn held(holds: Vec<RedisHold>) -> Step {
    Step::Held(
        holds
            .into_iter()
            .map(|h| Arc::new(h) as SharedHold)
            .collect(),
    )
}

impl Acquisition for Acquire<'_> {
    fn undos(&self) -> Option<&Undos> {
        Some(&self.inner.undos)
    }

    /// Redis has no session to enter: the acquire's holder ids are its entry, kept across
    /// connections (an attempt is idempotent for them).
    fn enter(&mut self) -> BoxFuture<'_, Result<()>> {
        Box::pin(async { Ok(()) })
    }

    fn attempt(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(Acquire::attempt(self))
    }

    fn wait(&mut self) -> BoxFuture<'_, Result<Step>> {
        Box::pin(async move { Ok(Acquire::wait(self).await) })
    }
}

impl Inner {
    /// One attempt of `ask` for `ids` on `keys`; a mutex waiter queues as `member` unless
    /// `queue` is false (a try).
    async fn attempt(
        &self,
        keys: &Keys,
        ask: Ask,
        ids: &[String],
        member: &str,
        queue: bool,
        queued: bool,
    ) -> redis::RedisResult<Attempt> {
        let inner = self;
        // Without tokens, a mutex's first attempt is the floor's bare `SET NX PX`: granted, it
        // is the whole acquire (token 0: none). Refused (or the key already names this holder:
        // a retry whose reply was lost), the script below decides, queueing the waiter.
        if matches!(ask, Ask::Mutex)
            && !inner.tokens
            && !queued
            && inner.acks.is_none()
            && self.set_nx(keys, &ids[0]).await?
        {
            return Ok(Attempt::Granted(0));
        }
        let acks = inner.acks;
        let (reply, acked) = inner
            .conn
            .run(&keys.exclusive, Some(inner.write_timeout()), |mut c| {
                let call = self.acquire_call(keys, ask, ids, member, queue, queued);
                async move {
                    let reply: Vec<i64> = call.invoke(&mut c).await?;
                    // A grant counts once enough replicas have it (asked on the same
                    // connection, right after).
                    let acked = match reply.first() {
                        Some(1) => Inner::acked(acks, &mut c).await?,
                        _ => Ok(()),
                    };
                    Ok((reply, acked))
                }
            })
            .await?;
        Ok(match acked {
            Ok(()) => Attempt::of_reply(&reply),
            Err(n) => Attempt::Unacked(n),
        })
    }

    /// The floor's bare `SET <exclusive key> id NX PX lease` (one request): whether it took
    /// the key.
    async fn set_nx(&self, keys: &Keys, id: &str) -> redis::RedisResult<bool> {
        let inner = self;
        let set: Option<String> = inner
            .conn
            .run(&keys.exclusive, Some(inner.conn.reply_timeout), |mut c| {
                let mut set = redis::cmd("SET");
                set.arg(&keys.exclusive)
                    .arg(id)
                    .arg("NX")
                    .arg("PX")
                    .arg(inner.lease_ms());
                async move { set.query_async(&mut c).await }
            })
            .await?;
        Ok(set.is_some())
    }

    /// The script call of one attempt of `ask` (see [`attempt`](Self::attempt)): the
    /// acquire script of its kind on the lock's keys, with the lease and the holder ids.
    fn acquire_call(
        &self,
        keys: &Keys,
        ask: Ask,
        ids: &[String],
        member: &str,
        queue: bool,
        queued: bool,
    ) -> scripts::Call {
        let lease = self.lease_ms();
        match ask {
            Ask::Mutex => {
                let mut call = scripts::Call::new(
                    &scripts::ACQUIRE_MUTEX,
                    &[&keys.exclusive, &keys.fence, &keys.queue, &keys.alive],
                );
                call.arg(&ids[0])
                    .arg(lease)
                    .arg(member)
                    .arg(if queue {
                        self.waiter_ttl.as_millis() as u64
                    } else {
                        0
                    })
                    .arg(if queued { "1" } else { "0" })
                    .arg(keys::NOTIFY_PREFIX);
                call
            }
            Ask::Write => {
                let mut call = scripts::Call::new(
                    &scripts::ACQUIRE_EXCLUSIVE,
                    &[&keys.exclusive, &keys.shared, &keys.fence, &keys.intent],
                );
                call.arg(&ids[0]).arg(lease).arg("1");
                call
            }
            Ask::Read => {
                let mut call = scripts::Call::new(
                    &scripts::ACQUIRE_READ,
                    &[&keys.exclusive, &keys.shared, &keys.fence, &keys.intent],
                );
                call.arg(&ids[0]).arg(lease);
                call
            }
            Ask::Leases { max } => {
                let mut call =
                    scripts::Call::new(&scripts::ACQUIRE_LEASES, &[&keys.shared, &keys.fence]);
                call.arg(lease).arg(max).arg(ids);
                call
            }
        }
    }
}
