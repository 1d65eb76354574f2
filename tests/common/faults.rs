//! Shared by the fault scenarios: lock workers that record a history for the checker, a recorded
//! hold and release, and the checks every scenario ends with — no contender node left, no watch
//! left on the servers.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use zklock::{zookeeper_client, DisconnectPolicy, LockGuard, LockManager};
use zklock_testkit::{History, Mode, Proxy, Recorder};

/// The root under which every lock of the default namespace lives.
pub const ROOT: &str = "/zklock";

/// What one worker does with a grant.
#[derive(Clone, Copy, Debug)]
pub struct Work {
    /// How long each acquire may wait.
    pub wait: Duration,
    /// How long each hold lasts (uniformly up to this).
    pub hold: Duration,
    /// Pause between attempts (uniformly up to this).
    pub think: Duration,
}

impl Default for Work {
    fn default() -> Work {
        Work {
            wait: Duration::from_secs(10),
            hold: Duration::from_millis(20),
            think: Duration::from_millis(10),
        }
    }
}

/// A flag that stops workers, and counts what they did.
#[derive(Clone, Default)]
pub struct Crew {
    stop: Arc<AtomicBool>,
    pub grants: Arc<AtomicU64>,
    pub failures: Arc<AtomicU64>,
    pub losses: Arc<AtomicU64>,
}

impl Crew {
    pub fn new() -> Crew {
        Crew::default()
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    pub fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    pub fn grants(&self) -> u64 {
        self.grants.load(Ordering::SeqCst)
    }

    /// Waits (bounded) until the workers have been granted `more` locks beyond `since`.
    pub async fn until_grants(&self, since: u64, more: u64, within: Duration) {
        let deadline = tokio::time::Instant::now() + within;
        while self.grants() < since + more {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no progress: {} grants within {within:?} (wanted {more} after {since})",
                self.grants() - since
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Holds `guard` for up to `hold`, stopping at once when the hold is reported lost; then records
/// the release and releases.
async fn hold_and_release(
    guard: LockGuard,
    key: &str,
    rec: &Recorder,
    crew: &Crew,
    hold: Duration,
) {
    let hold = rand::thread_rng().gen_range(Duration::ZERO..=hold);
    tokio::select! {
        biased;
        reason = guard.lost() => {
            rec.lost(key, reason);
            crew.losses.fetch_add(1, Ordering::SeqCst);
        }
        _ = tokio::time::sleep(hold) => {}
    }
    rec.release_invoked(key);
    match guard.release().await {
        Ok(()) => rec.release_ok(key),
        Err(e) => rec.release_failed(key, e),
    }
}

/// Records one acquire and what follows it.
async fn attempt<F>(acquire: F, key: &str, mode: Mode, rec: &Recorder, crew: &Crew, work: Work)
where
    F: Future<Output = zklock::Result<LockGuard>>,
{
    rec.acquire_invoked(key, mode);
    match acquire.await {
        Ok(guard) => {
            rec.acquire_ok(key, mode, guard.fencing_token().as_u128());
            crew.grants.fetch_add(1, Ordering::SeqCst);
            hold_and_release(guard, key, rec, crew, work.hold).await;
        }
        Err(e) => {
            rec.acquire_failed(key, mode, e);
            crew.failures.fetch_add(1, Ordering::SeqCst);
            // Don't spin while the servers are unreachable.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

async fn think(work: Work) {
    let pause = rand::thread_rng().gen_range(Duration::ZERO..=work.think);
    tokio::time::sleep(pause).await;
}

/// Locks and unlocks the mutex `key` until the crew stops, recording everything.
pub async fn mutex_worker(m: LockManager, key: String, rec: Recorder, crew: Crew, work: Work) {
    while !crew.stopped() {
        attempt(
            m.lock_timeout(&key, work.wait),
            &key,
            Mode::Exclusive,
            &rec,
            &crew,
            work,
        )
        .await;
        think(work).await;
    }
}

/// Takes part in the election `name` as `participant` until the crew stops: waits to lead (up
/// to `work.wait`), leads for up to `work.hold` or until told of a loss, leaves, and joins again.
/// Recorded as an exclusive hold of `leader:<name>` with the leadership's epoch as its token, so
/// the checker judges two leaders exactly as it judges two holders of a mutex.
pub async fn leader_worker(
    m: LockManager,
    name: String,
    participant: String,
    rec: Recorder,
    crew: Crew,
    work: Work,
) {
    let latch = m
        .leader_latch(&name, &participant)
        .expect("a valid election name");
    let key = format!("leader:{name}");
    while !crew.stopped() {
        rec.acquire_invoked(&key, Mode::Exclusive);
        match latch.lead_timeout(work.wait).await {
            Ok(leadership) => {
                rec.acquire_ok(&key, Mode::Exclusive, leadership.epoch().as_u128());
                crew.grants.fetch_add(1, Ordering::SeqCst);
                let hold = rand::thread_rng().gen_range(Duration::ZERO..=work.hold);
                tokio::select! {
                    biased;
                    reason = leadership.lost() => {
                        rec.lost(&key, reason);
                        crew.losses.fetch_add(1, Ordering::SeqCst);
                    }
                    _ = tokio::time::sleep(hold) => {}
                }
                rec.release_invoked(&key);
                match leadership.leave().await {
                    Ok(()) => rec.release_ok(&key),
                    Err(e) => rec.release_failed(&key, e),
                }
            }
            Err(e) => {
                rec.acquire_failed(&key, Mode::Exclusive, e);
                crew.failures.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        think(work).await;
    }
}

/// Reads or writes the read/write lock `key` until the crew stops (one write in `1/write_every`).
/// Recorded under `rw:<key>`, apart from the mutex of the same key.
pub async fn rw_worker(
    m: LockManager,
    key: String,
    rec: Recorder,
    crew: Crew,
    work: Work,
    write_every: u32,
) {
    let rw = m.rwlock(&key).expect("a valid key");
    let name = format!("rw:{key}");
    while !crew.stopped() {
        let write = rand::thread_rng().gen_range(0..write_every.max(1)) == 0;
        if write {
            attempt(
                rw.write_timeout(work.wait),
                &name,
                Mode::Exclusive,
                &rec,
                &crew,
                work,
            )
            .await;
        } else {
            attempt(
                rw.read_timeout(work.wait),
                &name,
                Mode::Shared,
                &rec,
                &crew,
                work,
            )
            .await;
        }
        think(work).await;
    }
}

/// Every znode below `root` (depth first), with its stat; `/zookeeper` is skipped.
pub async fn walk(
    client: &zookeeper_client::Client,
    root: &str,
) -> Result<Vec<(String, zookeeper_client::Stat)>, zookeeper_client::Error> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_string()];
    while let Some(path) = todo.pop() {
        let kids = match client.list_children(&path).await {
            Ok(k) => k,
            Err(zookeeper_client::Error::NoNode) => continue,
            Err(e) => return Err(e),
        };
        for k in kids {
            let child = if path == "/" {
                format!("/{k}")
            } else {
                format!("{path}/{k}")
            };
            if child == "/zookeeper" {
                continue;
            }
            if let Some(stat) = client.check_stat(&child).await? {
                out.push((child.clone(), stat));
            }
            todo.push(child);
        }
    }
    Ok(out)
}

/// The ephemeral (contender) nodes below `root`.
pub async fn contenders(client: &zookeeper_client::Client, root: &str) -> Vec<String> {
    walk(client, root)
        .await
        .expect("walk the lock tree")
        .into_iter()
        .filter(|(_, stat)| stat.ephemeral_owner != 0)
        .map(|(path, _)| path)
        .collect()
}

/// Waits (bounded) until no contender node is left below `root`: the nodes of released holds are
/// deleted by their owners, those of expired sessions by the server.
pub async fn assert_no_contenders(client: &zookeeper_client::Client, root: &str, within: Duration) {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left = contenders(client, root).await;
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() >= deadline {
            // Whose they are (session, creation zxid) tells which manager and which acquire
            // left them.
            let mut owners = Vec::new();
            for node in &left {
                match client.check_stat(node).await {
                    Ok(Some(stat)) => owners.push(format!(
                        "{node} (session {:#x}, czxid {:#x})",
                        stat.ephemeral_owner, stat.czxid
                    )),
                    _ => owners.push(format!("{node} (gone by now)")),
                }
            }
            panic!("contender nodes left behind after {within:?}: {owners:?}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The paths below `root` that a `wchp` answer lists as watched.
pub fn watched_paths(wchp: &str, root: &str) -> Vec<String> {
    wchp.lines()
        .filter(|l| l.starts_with('/'))
        .filter(|p| *p == root || p.starts_with(&format!("{root}/")))
        .map(str::to_string)
        .collect()
}

/// Waits (bounded) until no server that `wchp` asks has a watch below `root`. `wchp` returns the
/// answers of the servers to ask (skipping those that are down).
pub async fn assert_no_watches<F>(mut wchp: F, root: &str, within: Duration)
where
    F: FnMut() -> Vec<String>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let left: Vec<String> = wchp()
            .iter()
            .flat_map(|answer| watched_paths(answer, root))
            .collect();
        if left.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "watches left on the servers after {within:?}: {left:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Counts the disconnections of `m`'s current session from now on (to prove a fault reached it).
pub fn count_disconnections(m: &LockManager) -> Arc<AtomicU64> {
    let count = Arc::new(AtomicU64::new(0));
    let mut watcher = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .state_watcher();
    tokio::spawn({
        let count = count.clone();
        async move {
            loop {
                match watcher.changed().await {
                    zookeeper_client::SessionState::Disconnected => {
                        count.fetch_add(1, Ordering::SeqCst);
                    }
                    state if state.is_terminated() => return,
                    _ => {}
                }
            }
        }
    });
    count
}

/// Two managers behind one proxy, each on a session of its own, to be cut off together (a
/// partition): `strict` with Curator's policy (a disconnection is a loss) and `lenient` with a
/// grace well under the session timeout.
pub struct CutOff {
    pub proxy: Proxy,
    pub session: Duration,
    pub grace: Duration,
    pub strict: LockManager,
    pub lenient: LockManager,
}

impl CutOff {
    /// Both managers, on the server at `connect` through a new proxy.
    pub async fn start(connect: &str, session: Duration, grace: Duration) -> CutOff {
        let proxy = Proxy::start(connect).unwrap();
        let strict = LockManager::builder(proxy.connect_string())
            .zookeeper(|zk| zk.session_timeout(session))
            .connect()
            .await
            .unwrap();
        let lenient = LockManager::builder(proxy.connect_string())
            .zookeeper(|zk| {
                zk.session_timeout(session)
                    .disconnect_policy(DisconnectPolicy::Grace(grace))
            })
            .connect()
            .await
            .unwrap();
        CutOff {
            proxy,
            session,
            grace,
            strict,
            lenient,
        }
    }

    /// The two managers with their names (`strict` first) and a name for what each takes.
    pub fn each<'a>(&self, names: [&'a str; 2]) -> [(&LockManager, &'a str, &'static str); 2] {
        [
            (&self.strict, names[0], "strict"),
            (&self.lenient, names[1], "lenient"),
        ]
    }

    /// The partition: the proxy blackholes, recorded as the fault `what`; answers when.
    pub fn partition(&self, history: &History, what: &str) -> Instant {
        history.fault(what);
        let cut = Instant::now();
        self.proxy.blackhole();
        cut
    }

    /// Each manager (`strict` first) was told of its loss `told_after` the cut before the server
    /// could expire its session: the server cannot before it has heard nothing for the session
    /// timeout, and the last it heard was before the cut.
    pub fn assert_told_in_time(&self, told_after: &[Duration]) {
        let session = self.session;
        for (told, name) in told_after.iter().zip(["strict", "lenient"]) {
            assert!(
                *told < session,
                "{name} was told after {told:?}, but the server may expire its session after {session:?}"
            );
        }
    }
}

/// Flushes `managers`, then waits (bounded) until no contender node is left below [`ROOT`] on
/// the server that the last of them sees.
pub async fn flush_and_assert_no_contenders(managers: &[&LockManager], within: Duration) {
    for m in managers {
        m.flush().await;
    }
    assert_no_contenders(
        &managers[managers.len() - 1]
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        within,
    )
    .await;
}

/// Sends `sig` (`-STOP`, `-CONT`, `-KILL`, ...) to the process `pid`.
pub fn signal(pid: u32, sig: &str) {
    let status = std::process::Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success(), "kill {sig} {pid}");
}

/// SIGSTOP the process `pid` (`name` in messages), and wait until every thread of it has
/// stopped.
pub fn freeze(pid: u32, name: &str) {
    signal(pid, "-STOP");
    let tasks = std::path::PathBuf::from(format!("/proc/{pid}/task"));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let running = std::fs::read_dir(&tasks)
            .unwrap()
            .flatten()
            .filter(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                let state = stat.rsplit(')').next().unwrap_or("").trim_start();
                !(state.is_empty() || state.starts_with(['T', 't', 'Z', 'X']))
            })
            .count();
        if running == 0 {
            return;
        }
        assert!(Instant::now() < deadline, "{name} did not stop");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// `m` locks `key` for the worker `rec` within `within`, recorded.
pub async fn hold(m: &LockManager, key: &str, rec: &Recorder, within: Duration) -> LockGuard {
    rec.acquire_invoked(key, Mode::Exclusive);
    let guard = tokio::time::timeout(within, m.lock(key))
        .await
        .expect("granted in time")
        .expect("granted");
    rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
    guard
}

/// Releases `guard`, recorded: `Ok` when the release says the hold was still there.
pub async fn release(guard: LockGuard, key: &str, rec: &Recorder) -> zklock::Result<()> {
    rec.release_invoked(key);
    let result = guard.release().await;
    match &result {
        Ok(()) => rec.release_ok(key),
        Err(e) => rec.release_failed(key, e),
    }
    result
}
