//! Faults of the etcd backend against real etcd from the test kit, each judged by the history
//! checker: no two believed holders at any moment (a hold counts from its grant to its release
//! or its reported loss), tokens strictly increasing in grant order.
//!
//! 1. A follower of a 3-member cluster killed and restarted under contention.
//! 2. The leader killed while a lock is held and a waiter queued: the hold survives the leader
//!    change (etcd keeps leases) or is reported lost; the waiter's token is above the holder's.
//! 3. A holder partitioned through the test kit's relay past its lease: told before the other
//!    manager is granted (measured from the history), which gets in once etcd lets the lease
//!    go; healed, the partitioned manager locks again with a larger token.
//! 4. The holder's process frozen (SIGSTOP) past its lease: the next process gets in with a
//!    larger token, the woken holder's write is refused by the etcd fence, and it reports its
//!    loss as soon as it runs.
//! 5. The holder's lease revoked from outside (`etcdctl lease revoke`): reported within about a
//!    third of the lease; the next gets in; the manager recovers on a new lease.
//! 6. The holder's key deleted from outside (`etcdctl del`): a watching holder is told at once;
//!    the other manager's waiter gets in, and a task of the holder's process queued behind it
//!    locally gets in on a key of its own, both with larger tokens.
//! 7. etcd itself killed and restarted with its data: holds survive or are reported lost, and
//!    every grant after the restart has a token above every conflicting grant of its lock
//!    before the kill.
//! 8. One of a manager's two paths to etcd held up while the other,
//!    and its lease, work: a put sent again after no answer in time must not land after the
//!    release and leave a key on the live lease that blocks the lock.
//! 9. A follower of a 3-member cluster frozen (SIGSTOP) past every lease, then the leader for
//!    1.5 s, while managers with leases of 3, 4 and 6 s hold a key each beside contending
//!    workers: with a majority standing, no hold is lost, and no two believed holders.
//!
//! Leases are 2 or 3 s, the shortest etcd grants, so that the binary stays short.

//!
//! One file per fault: `killed_member` (1, 2), `partition` (3), `frozen_holder` (4),
//! `lease_revoked` (5), `key_deleted` (6), `etcd_restarted` (7), `held_up_put` (8),
//! `frozen_member` (9); this one holds the steps they share (managers, etcdctl, recorded holds
//! and waiters, contending workers, the end check that no key is left).

#[path = "../../common/mod.rs"]
mod common;
#[path = "../../common/faults.rs"]
mod faults;

mod etcd_restarted;
mod frozen_holder;
mod frozen_member;
mod held_up_put;
mod key_deleted;
mod killed_member;
mod lease_revoked;
mod partition;

use std::time::{Duration, Instant};

use common::{eventually, say};
use faults::{leader_worker, mutex_worker, release, rw_worker, Crew, Work};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use zklock::{FencingToken, LockGuard, LockManager, LossReason};
use zklock_testkit::{EtcdCluster, EtcdServer, History, Mode, Recorder};

/// The lease of most managers here: kept alive every second.
const LEASE: Duration = Duration::from_secs(3);
/// The shortest lease etcd grants, for the tests that wait for one to run out.
const SHORT: Duration = Duration::from_secs(2);
/// The bound of every wait for progress after a fault.
const PROGRESS: Duration = Duration::from_secs(30);

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

async fn etcd_manager(url: &str, lease: Duration) -> LockManager {
    LockManager::builder(url)
        .etcd(|e| e.lease(lease))
        .connect()
        .await
        .expect("connect to the test etcd")
}

/// Runs `etcdctl` against one server or the live members of a cluster.
trait Etcdctl {
    fn ctl(&self, args: &[&str]) -> std::io::Result<String>;
}

impl Etcdctl for EtcdServer {
    fn ctl(&self, args: &[&str]) -> std::io::Result<String> {
        self.etcdctl(args)
    }
}

impl Etcdctl for EtcdCluster {
    fn ctl(&self, args: &[&str]) -> std::io::Result<String> {
        self.etcdctl(args)
    }
}

/// The keys under `prefix`, as etcdctl lists them.
fn keys_under(etcd: &impl Etcdctl, prefix: &str) -> Vec<String> {
    blocking(|| etcd.ctl(&["get", "--prefix", prefix, "--keys-only"]))
        .expect("etcdctl get")
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

/// Waits (bounded) until `n` contenders' keys are under lock path `path`: orders a test's
/// steps, never assumes one happened.
async fn until_contenders(etcd: &impl Etcdctl, path: &str, n: usize) {
    let prefix = format!("{path}/");
    eventually(
        &format!("{n} contenders under {prefix}"),
        Duration::from_secs(15),
        || async { keys_under(etcd, &prefix).len() == n },
    )
    .await;
}

/// Flushes `managers`, then waits (bounded) until no key of zklock's is left on etcd: released
/// holds delete their keys, lost ones go with their leases.
async fn assert_no_keys_left(etcd: &impl Etcdctl, managers: &[&LockManager]) {
    for m in managers {
        m.flush().await;
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let left = keys_under(etcd, "/zklock");
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "keys left behind on etcd: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `m` locks `key` for the worker `rec`, recorded, within [`PROGRESS`].
async fn hold(m: &LockManager, key: &str, rec: &Recorder) -> LockGuard {
    faults::hold(m, key, rec, PROGRESS).await
}

/// A waiter of another manager: locks `key` (recorded), releases at once, and answers its token.
fn waiter(m: LockManager, key: &'static str, rec: Recorder) -> JoinHandle<FencingToken> {
    tokio::spawn(async move {
        let guard = hold(&m, key, &rec).await;
        let token = guard.fencing_token();
        release(guard, key, &rec).await.expect("a clean release");
        token
    })
}

/// A hold whose loss a task of its own watches from now on (the holder called `lost()`, which
/// also watches its key), recording the loss when told.
struct Watched {
    told: oneshot::Receiver<(LossReason, Instant)>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<LockGuard>,
}

impl Watched {
    fn start(guard: LockGuard, key: &'static str, rec: Recorder) -> Watched {
        let (tell, told) = oneshot::channel();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tokio::select! {
                biased;
                reason = guard.lost() => {
                    rec.lost(key, reason);
                    let _ = tell.send((reason, Instant::now()));
                }
                _ = stopped => {}
            }
            guard
        });
        Watched { told, stop, task }
    }

    /// The loss and when it was told, if it is within `within`.
    async fn told_within(&mut self, within: Duration) -> Option<(LossReason, Instant)> {
        tokio::time::timeout(within, &mut self.told)
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// Stops watching; the guard back.
    async fn end(self) -> LockGuard {
        let _ = self.stop.send(());
        self.task.await.expect("the watching task")
    }
}

/// Mutex, read/write and election workers of each named manager on a few keys, recorded as
/// `<name>/<what>`.
fn contend(
    managers: &[(&str, &LockManager)],
    history: &History,
    crew: &Crew,
    keys: &[&str],
) -> Vec<JoinHandle<()>> {
    let work = Work {
        wait: Duration::from_secs(20),
        hold: Duration::from_millis(30),
        think: Duration::from_millis(10),
    };
    let mut tasks = Vec::new();
    for (name, m) in managers {
        for key in keys {
            tasks.push(tokio::spawn(mutex_worker(
                (*m).clone(),
                key.to_string(),
                history.recorder(&format!("{name}/{key}")),
                crew.clone(),
                work,
            )));
        }
        tasks.push(tokio::spawn(rw_worker(
            (*m).clone(),
            "shelf".into(),
            history.recorder(&format!("{name}/rw")),
            crew.clone(),
            work,
            3,
        )));
        tasks.push(tokio::spawn(leader_worker(
            (*m).clone(),
            "scheduler".into(),
            name.to_string(),
            history.recorder(&format!("{name}/leader")),
            crew.clone(),
            work,
        )));
    }
    tasks
}

async fn stop(crew: &Crew, tasks: Vec<JoinHandle<()>>) {
    crew.stop();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("workers stop")
            .expect("a worker panicked");
    }
}
