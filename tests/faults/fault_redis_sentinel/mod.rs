//! Faults of the Redis backend under Sentinel (`redis+sentinel://`), against the test kit's
//! primary with two replicas and three Sentinels on loopback, each judged by the history
//! checker (no two believed holders of a key at any moment, tokens strictly increasing in grant
//! order) and, where stale writes are the point, by the Redis fence on a plain Redis of its own
//! (it survives the lock store's failovers).
//!
//! 1. The primary killed (SIGKILL) while managers contend on a few keys and each holds one
//!    more: Sentinel promotes a replica; every hold of the killed primary is reported lost
//!    (`Failover` or `Disconnected`); every grant after the kill has a token above every
//!    earlier token of its key.
//! 2. A manual failover (`SENTINEL FAILOVER`) under the same load: the same, and the old
//!    holders are told `Failover`.
//! 3. Split brain: the primary frozen (SIGSTOP) past `down-after` and the failover, with a
//!    holder's lease that the replicas lack (not replicated); then woken, still a primary for
//!    a while. The overlap of believed holds is measured and reported, bounded by the lease;
//!    every write of the old holder after the new holder's first write is refused by the
//!    fence, whose token stays above every token of the old primary.
//! 4. A failover to a replica that lacks a key's token counter, with the new primary's clock
//!    behind (the kit's `ServerClock`): tokens stay above the old ones while the clock is
//!    behind by less than the time since the old primary's last grant (at least the
//!    failover's duration), and go back beyond it.
//! 5. The primary frozen (SIGSTOP) past `down-after` under managers of different settings,
//!    then woken as soon as the Sentinels name the promoted replica: no manager that acted on
//!    the failover grants on the woken old primary.
//!
//! The tests take turns (one Sentinel setup at a time): each one's timing (Sentinel's
//! `down-after`, leases) must not depend on how busy two cores are with another's servers.
//!
//! One file per fault: `killed_primary` (1), `manual_failover` (2), `split_brain` (3),
//! `clock_behind` (4), `frozen_primary` (5); this one holds the steps they share (the managers,
//! the contended load, a write taken off the replicas).

use crate::common;
use crate::failover;

use std::time::{Duration, Instant};

use common::{eventually, say};
use failover::*;
use tokio::task::JoinHandle;
use zklock::{LockGuard, LockManager, LossReason};
use zklock_testkit::{now_ns, History, Recorder, RedisSentinel, Report};

mod clock_behind;
mod frozen_primary;
mod killed_primary;
mod manual_failover;
mod split_brain;

/// The lease of the contending managers: renewed every second.
const LEASE: Duration = Duration::from_secs(3);
/// The bound of every wait for progress after a fault.
const PROGRESS: Duration = Duration::from_secs(30);

/// One Sentinel setup at a time in this binary.
static TURNS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

fn sentinel_url(redis: &RedisSentinel) -> String {
    sentinel_url_from(redis, 0)
}

/// The Sentinel URL listing the Sentinels from the `first`-th on (as services configured each
/// in its own way would): each manager then asks, and listens to, another Sentinel first.
fn sentinel_url_from(redis: &RedisSentinel, first: usize) -> String {
    let mut addrs = redis.sentinel_addrs();
    let n = addrs.len();
    addrs.rotate_left(first % n);
    format!(
        "redis+sentinel://{}/{}",
        addrs.join(","),
        redis.master_name()
    )
}

async fn manager(url: &str, lease: Duration) -> LockManager {
    LockManager::builder(url)
        .redis(|r| r.lease(lease))
        .connect()
        .await
        .expect("connect through the Sentinels")
}

/// The backend's counter of `key`'s tokens and its exclusive key, as `m` names them.
fn redis_keys(m: &LockManager, key: &str) -> (String, String) {
    let path = m.path_of(key).expect("a valid key");
    (
        format!("zklock:fence:{path}"),
        format!("zklock:lock:{path}"),
    )
}

/// On every replica of `redis` (every node but `primary`): waits until it has `key` (it was
/// replicated), then deletes it there, as a replication that had not carried the write yet
/// would leave it. Replicas refuse writes unless told otherwise (`replica-read-only no`).
async fn unreplicate(redis: &RedisSentinel, primary: usize, key: &str) {
    for i in (0..redis.len()).filter(|&i| i != primary) {
        eventually(
            &format!("node {i} to have {key} replicated"),
            Duration::from_secs(10),
            || async {
                blocking(|| redis.command(i, &["EXISTS", key]))
                    .unwrap()
                    .int()
                    == Some(1)
            },
        )
        .await;
        blocking(|| {
            redis.command(i, &["CONFIG", "SET", "replica-read-only", "no"])?;
            redis.command(i, &["DEL", key])
        })
        .expect("delete the key on a replica");
    }
}

/// The load of tests 1 and 2: the named managers contend on `a` and `b` (mutexes) and a
/// read/write lock, and each holds a key of its own (`own-<i>`) until told of its loss.
struct Load {
    /// Kept connected until the load is finished.
    _managers: Vec<(String, LockManager)>,
    contention: Contention,
    kept: Vec<JoinHandle<LossReason>>,
}

impl Load {
    /// Connects a manager to each URL, starts the load and waits for 30 grants.
    async fn start(urls: impl IntoIterator<Item = String>) -> Load {
        let mut managers = Vec::new();
        for (i, url) in urls.into_iter().enumerate() {
            managers.push((format!("m{i}"), manager(&url, LEASE).await));
        }
        let keys = ["a".to_string(), "b".to_string()];
        let contention = Contention::start(&managers, &keys, true);
        let mut kept = Vec::new();
        for (i, (_, m)) in managers.iter().enumerate() {
            let (key, rec) = (
                format!("own-{i}"),
                contention.history.recorder(&format!("m{i}/own")),
            );
            let guard = hold(m, &key, &rec, PROGRESS).await;
            kept.push(kept_until_lost(guard, key, rec));
        }
        contention.crew.until_grants(0, 30, PROGRESS).await;
        Load {
            _managers: managers,
            contention,
            kept,
        }
    }

    /// Stops the load; checks the history (nothing excused) and, across `fault_ns`, the tokens
    /// (above on at least two keys, `across` naming the fault) and the losses (`Failover` or
    /// `Disconnected`). Answers the report, the keys granted on both sides and the holds lost.
    async fn finish(self, fault_ns: u64, across: &str) -> (Report, usize, usize) {
        let history = self.contention.stop().await;
        let report = checked(&history);
        let keys = assert_tokens_above_across(&report, fault_ns).len();
        assert!(
            keys >= 2,
            "keys granted on both sides{across}: {keys}\n{report}"
        );
        let lost = assert_losses_across_among(
            &report,
            fault_ns,
            &[LossReason::Failover, LossReason::Disconnected],
        );
        (report, keys, lost.values().sum())
    }
}
