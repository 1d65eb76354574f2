//! What the cut-at-every-request sweeps share, whatever the backend: the protocols a victim
//! runs, the kinds of cut, how a run is recorded for the history checker, and the sweep over
//! every request boundary. Each backend's file (`cut_every_request*.rs`) says how its victim is
//! cut off (the ZooKeeper proxy, the test kit's relay) and what "nothing left" means there.
#![allow(dead_code)]

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use zklock::{
    current_fencing_token, FencingToken, Leadership, Lease, LockGuard, LockManager, LossReason,
};
use zklock_testkit::{After, History, Mode, Op, Recorder, Relay};

/// How long a victim waits for its lock, and the other process for its own after the cut.
pub const WAIT: Duration = Duration::from_secs(20);
/// How long a victim holds in a run that is not cut off for good.
pub const HOLD: Duration = Duration::from_millis(100);
/// A job's `at_least` window: longer than any run of a sweep.
pub const WINDOW: Duration = Duration::from_secs(60);
/// How long the victim of [`Protocol::Abandon`] waits before it gives up.
pub const ABANDON: Duration = Duration::from_millis(700);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Protocol {
    Mutex,
    /// The victim queues behind a holder of another process and is handed the lock.
    Handover,
    /// The victim queues behind a holder of another process and gives up at its deadline
    /// ([`ABANDON`]) while the holder still holds; the holder lets go after.
    Abandon,
    Read,
    Write,
    /// A lease of a semaphore of one.
    Semaphore,
    /// `job(key).at_least(WINDOW).run(..)`.
    Job,
    Leader,
    /// A mutex of a victim without fencing tokens (`fencing_tokens(false)`): on Redis a bare
    /// `SET NX PX`, on PostgreSQL grants that write nothing.
    Untokened,
    /// [`Handover`](Self::Handover) to a victim without fencing tokens: on Redis its first
    /// attempt's bare `SET NX PX` is refused, and the script that follows queues it.
    UntokenedHandover,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cut {
    /// The reply withheld, the connection reset: the client reconnects at once.
    Reset,
    /// The reply withheld, the client cut off, and its future dropped while it waits.
    Cancel,
    /// The reply withheld and the client cut off for good, as a killed process or a dead host.
    Kill,
}

pub const CUTS: [Cut; 3] = [Cut::Reset, Cut::Cancel, Cut::Kill];

/// What a protocol's take gives: a guard, a lease or a leadership.
pub enum Held {
    Guard(LockGuard),
    Lease(Lease),
    Lead(Leadership),
}

impl Held {
    pub fn token(&self) -> FencingToken {
        match self {
            Held::Guard(g) => g.fencing_token(),
            Held::Lease(l) => l.fencing_token(),
            Held::Lead(l) => l.epoch(),
        }
    }

    pub async fn lost(&self) -> LossReason {
        match self {
            Held::Guard(g) => g.lost().await,
            Held::Lease(l) => l.lost().await,
            Held::Lead(l) => l.lost().await,
        }
    }

    pub async fn release(self) -> zklock::Result<()> {
        match self {
            Held::Guard(g) => g.release().await,
            Held::Lease(l) => l.release().await,
            Held::Lead(l) => l.leave().await,
        }
    }
}

impl Protocol {
    /// Whether the victim's manager issues fencing tokens.
    pub fn tokens(self) -> bool {
        !matches!(self, Protocol::Untokened | Protocol::UntokenedHandover)
    }

    /// The victim's mode in the history (a reader shares; everything else excludes).
    pub fn mode(self) -> Mode {
        match self {
            Protocol::Read => Mode::Shared,
            _ => Mode::Exclusive,
        }
    }

    /// Takes the lock `key` of this protocol (the other process takes the conflicting side:
    /// a writer against a reader; the lock of a job's name).
    pub async fn take(self, m: &LockManager, key: &str, other: bool) -> zklock::Result<Held> {
        Ok(match self {
            Protocol::Abandon if !other => Held::Guard(m.lock_timeout(key, ABANDON).await?),
            Protocol::Mutex
            | Protocol::Handover
            | Protocol::Abandon
            | Protocol::Job
            | Protocol::Untokened
            | Protocol::UntokenedHandover => Held::Guard(m.lock_timeout(key, WAIT).await?),
            Protocol::Read if !other => Held::Guard(m.rwlock(key)?.read_timeout(WAIT).await?),
            Protocol::Read | Protocol::Write => {
                Held::Guard(m.rwlock(key)?.write_timeout(WAIT).await?)
            }
            Protocol::Semaphore => Held::Lease(m.semaphore(key, 1)?.acquire_timeout(WAIT).await?),
            Protocol::Leader => {
                let id = if other { "other" } else { "victim" };
                Held::Lead(m.leader_latch(key, id)?.lead_timeout(WAIT).await?)
            }
        })
    }
}

/// Takes, holds `hold` (stopping when told of a loss), releases; records it all.
pub async fn take_hold_release(
    protocol: Protocol,
    m: &LockManager,
    key: &str,
    rec: &Recorder,
    other: bool,
    hold: Duration,
) {
    let mode = if other {
        Mode::Exclusive
    } else {
        protocol.mode()
    };
    rec.acquire_invoked(key, mode);
    let held = match protocol.take(m, key, other).await {
        Ok(held) => held,
        Err(e) => {
            rec.acquire_failed(key, mode, e);
            return;
        }
    };
    rec.acquire_ok(key, mode, recorded(held.token()));
    tokio::select! {
        biased;
        reason = held.lost() => rec.lost(key, reason),
        _ = tokio::time::sleep(hold) => {}
    }
    rec.release_invoked(key);
    match held.release().await {
        Ok(()) => rec.release_ok(key),
        Err(e) => rec.release_failed(key, e),
    }
}

/// Runs the job `key` with its `at_least` window: the body records its hold (from its start
/// to its end: the lock is given up after) and counts itself in `bodies`.
pub async fn run_job(
    m: &LockManager,
    key: &str,
    rec: &Recorder,
    bodies: &AtomicUsize,
    hold: Duration,
) {
    rec.acquire_invoked(key, Mode::Exclusive);
    let job = match m.job(key) {
        Ok(job) => job.at_least(WINDOW),
        Err(e) => return rec.acquire_failed(key, Mode::Exclusive, e),
    };
    let started = AtomicBool::new(false);
    let ran = job
        .run(async {
            let token = current_fencing_token().expect("a job's body runs in a frame");
            rec.acquire_ok(key, Mode::Exclusive, recorded(token));
            started.store(true, Ordering::SeqCst);
            bodies.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(hold).await;
            rec.release_invoked(key);
        })
        .await;
    match ran {
        Ok(zklock::Ran::Ran(())) => rec.release_ok(key),
        Ok(zklock::Ran::Skipped) => rec.acquire_failed(key, Mode::Exclusive, "skipped"),
        // The body was stopped: its hold was lost while it ran.
        Err(e) if started.load(Ordering::SeqCst) => rec.lost(key, e),
        Err(e) => rec.acquire_failed(key, Mode::Exclusive, e),
    }
}

/// Whether every kind of cut runs at every k (`ZKLOCK_CUTS=all`), or one kind per k.
pub fn all_cuts() -> bool {
    std::env::var("ZKLOCK_CUTS").is_ok_and(|v| v == "all")
}

/// Runs `protocol` once uncut (`run(key, None)` answers how many requests the victim sent),
/// then once per request boundary k and kind of cut. In CI each k gets one kind, rotating from
/// `offset`, and the last k also `Kill` when `kill_last` (a partition that begins while the
/// victim holds: the run that checks its loss deadline against the server's).
pub async fn sweep<F, Fut>(protocol: Protocol, offset: usize, kill_last: bool, mut run: F)
where
    F: FnMut(String, Option<(u64, Cut)>) -> Fut,
    Fut: Future<Output = u64>,
{
    let started = std::time::Instant::now();
    let n = run(format!("{protocol:?}_uncut").to_lowercase(), None).await;
    assert!(n > 0, "{protocol:?} sent no request");
    let mut runs = 0;
    // Counted by the runs: those skipped for a known bug of the backend.
    let skipped = Arc::new(AtomicUsize::new(0));
    for k in 1..=n {
        let mut cuts: Vec<Cut> = if all_cuts() {
            CUTS.to_vec()
        } else {
            vec![CUTS[(k as usize + offset) % CUTS.len()]]
        };
        if kill_last && k == n && !cuts.contains(&Cut::Kill) {
            cuts.push(Cut::Kill);
        }
        for how in cuts {
            let key = format!("{protocol:?}_{k}_{how:?}").to_lowercase();
            SKIPPED
                .scope(skipped.clone(), run(key, Some((k, how))))
                .await;
            runs += 1;
        }
    }
    let skipped = skipped.load(Ordering::SeqCst);
    if skipped == 0 {
        eprintln!(
            "{protocol:?}: {n} requests, {runs} cut runs, every one checked, in {:?}",
            started.elapsed()
        );
    } else {
        eprintln!(
            "{protocol:?}: {n} requests, {runs} cut runs, {skipped} skipped for a known bug, \
             the others checked, in {:?}",
            started.elapsed()
        );
    }
}

tokio::task_local! {
    /// How many runs of the sweep under way were skipped for a known bug of the backend.
    static SKIPPED: Arc<AtomicUsize>;
}

/// A lease backend's server as a relayed sweep sees it (Redis, PostgreSQL, etcd): where it
/// listens, and what it holds for a lock, read with a plain client of its own.
pub trait LeaseServer {
    /// The lease of the victim's and the other's managers.
    const LEASE: Duration;
    /// The server's URL (managers connect with it, or through the relay with its port changed).
    fn url(&self) -> String;
    /// The server's `host:port`, for the relay.
    fn addr(&self) -> String;
    /// The lock path of `key` in `protocol`, where the server keeps its holders.
    fn lock_path(&self, m: &LockManager, protocol: Protocol, key: &str) -> String;
    /// Whether a process waits for the lock at `path` (queued, registered as a waiter).
    async fn waiting(&self, path: &str) -> bool;
    /// The job at `path`'s recorded window end, in the server's units, if any.
    async fn window(&self, path: &str) -> Option<i64>;
    /// What the server still holds for the lock at `path` (holder keys, advisory locks).
    async fn left(&self, path: &str) -> Vec<String>;
    /// What the server still keeps of the process named `identity` (its sessions); nothing
    /// where the server keeps no session of its own.
    async fn sessions_left(&self, identity: &str) -> Vec<String>;
    /// The victim's way to the server: the relays its connections go through (started beside
    /// each other: its requests are counted and cut over all of them, see
    /// [`Relay::start_beside`]) and the URL it connects with. By default one relay in front of
    /// [`addr`](Self::addr), and [`url`](Self::url) through it. Called once per run, after the
    /// other process connected and before the victim does. The relays may outlive the run
    /// (kept by the server for the next runs); a run's victim cut off for good leaves them
    /// partitioned.
    async fn victim_route(&self) -> (Arc<Vec<Relay>>, String) {
        let relay = Relay::start(&self.addr()).unwrap();
        let url = relay.url(&self.url());
        (Arc::new(vec![relay]), url)
    }
    /// The run is over (judged, its victim gone): undo what [`victim_route`](Self::victim_route)
    /// changed on the server. Nothing by default.
    async fn victim_gone(&self) {}
    /// A known bug of the backend that this run (of `protocol`, cut by `cut`, with the victim's
    /// part of `history` over, on the lock at `path`) ran into, as the server shows it: the run
    /// is then skipped, naming the bug, once the victim is gone. `None` (the default): judged.
    async fn known_bug(
        &self,
        _protocol: Protocol,
        _cut: Option<(u64, Cut)>,
        _history: &History,
        _path: &str,
    ) -> Option<String> {
        None
    }
}

/// A token as the history records it: [`NO_TOKEN`](zklock_testkit::NO_TOKEN) for a hold that
/// has none (its manager issues none), which the checker leaves out of its token order.
pub fn recorded(token: FencingToken) -> u128 {
    if token.is_none() {
        zklock_testkit::NO_TOKEN
    } else {
        token.as_u128()
    }
}

async fn lease_manager<S: LeaseServer>(url: &str, identity: &str, tokens: bool) -> LockManager {
    let builder = LockManager::builder(url);
    match zklock::BackendKind::of(url).unwrap() {
        zklock::BackendKind::Postgres => builder.postgres(|pg| pg.lease(S::LEASE)),
        zklock::BackendKind::Etcd => builder.etcd(|e| e.lease(S::LEASE)),
        zklock::BackendKind::MySql => builder.mysql(|my| my.lease(S::LEASE)),
        _ => builder.redis(|r| r.lease(S::LEASE)),
    }
    .identity(identity)
    .fencing_tokens(tokens)
    .connect()
    .await
    .expect("connect to the test server")
}

/// How long a cut-off victim is left waiting before its future is dropped (`Cancel`).
const STUCK: Duration = Duration::from_secs(1);

/// Whether the other process holds first and hands the lock to the victim (or, when the victim
/// abandons its wait, lets go once it gave up).
pub fn hands_over(protocol: Protocol) -> bool {
    matches!(
        protocol,
        Protocol::Handover | Protocol::Abandon | Protocol::UntokenedHandover
    )
}

/// The hand-over's first holder: the other process takes `key` before the victim asks.
pub async fn hold_first(
    history: &History,
    other: &LockManager,
    key: &str,
) -> (LockGuard, Recorder) {
    let rec = history.recorder("first");
    rec.acquire_invoked(key, Mode::Exclusive);
    let g = other.lock(key).await.unwrap();
    rec.acquire_ok(key, Mode::Exclusive, g.fencing_token().as_u128());
    (g, rec)
}

/// The first holder lets go, recorded.
pub async fn release_first((g, rec): (LockGuard, Recorder), key: &str) {
    rec.release_invoked(key);
    g.release().await.unwrap();
    rec.release_ok(key);
}

/// A victim cut off waits for a reply that never comes: given `stuck` to end on its own, its
/// future is then dropped wherever it waits.
pub async fn drop_victim_when_stuck(run: JoinHandle<()>, stuck: Duration) {
    let abort = run.abort_handle();
    if let Ok(done) = tokio::time::timeout(stuck, run).await {
        done.expect("the victim's task");
    }
    abort.abort();
}

/// The checker's verdict on a run: no two believed holders, tokens increasing; and the other
/// process did get the lock.
pub fn assert_history_ok(history: &History, protocol: Protocol, cut: Option<(u64, Cut)>) {
    let report = history.check();
    assert!(
        report.is_ok(),
        "{protocol:?}, cut {cut:?}: {}\n{:#?}",
        report.summary(),
        history.events()
    );
    assert!(
        history
            .events()
            .iter()
            .any(|e| e.worker == "other" && matches!(e.op, Op::AcquireOk { .. })),
        "{protocol:?}, cut {cut:?}: the other process never got the lock\n{:#?}",
        history.events()
    );
}

/// One run of `protocol` on `key` by a victim whose every connection goes through a relay that
/// cuts after its `k`-th request (`None`: no cut), judged by the history checker, with nothing
/// left on the server after; returns how many requests the victim sent.
///
/// The kinds of cut on a relay: `Reset` resets the connection that carried the request (the
/// client reconnects at once); `Cancel` resets it, cuts the victim off, drops the victim's
/// future while it waits, and heals; `Kill` cuts the victim off for good without a reset, as a
/// partition or a dead host: the server hears nothing, so only the lease (and on PostgreSQL its
/// `idle_session_timeout`) ends the victim's hold, and the victim holds until told it is lost,
/// while the other process waits; then it is killed.
pub async fn run_through_relay<S: LeaseServer>(
    server: &S,
    protocol: Protocol,
    key: &str,
    cut: Option<(u64, Cut)>,
) -> u64 {
    let run = RelayRun::start(server, protocol, key, cut).await;
    // The listening (pub/sub) connection starts in the background: let it settle, so that k
    // counts the protocol's requests.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = run.relay().requests();
    let victim_run = run.victim_runs().await;
    let sent = run.relay().requests() - before;
    if run.how() != Some(Cut::Kill) {
        run.heal();
        run.victim.flush().await;
    }
    if let Some(bug) = server
        .known_bug(protocol, cut, &run.history, &run.path)
        .await
    {
        eprintln!("{protocol:?}, cut {cut:?}: SKIPPED, a known bug of the backend: {bug}");
        let _ = SKIPPED.try_with(|n| n.fetch_add(1, Ordering::SeqCst));
        run.skip(victim_run).await;
        server.victim_gone().await;
        return sent;
    }
    run.other_takes_the_lock().await;
    run.end(victim_run).await;
    server.victim_gone().await;
    sent
}

/// Sweeps `protocol` on `server` through a relay: [`sweep`] of [`run_through_relay`].
pub async fn sweep_through_relay<S: LeaseServer>(server: &S, protocol: Protocol, offset: usize) {
    // The last request of an uncut run is the release; a killed victim holds until told of
    // its loss, so its last request is one of its hold's liveness checks: always run it.
    sweep(protocol, offset, true, |key, cut| async move {
        run_through_relay(server, protocol, &key, cut).await
    })
    .await;
}

/// One run of [`run_through_relay`]: the other process and the victim behind its relay, and
/// what the checker sees.
struct RelayRun<'a, S: LeaseServer> {
    server: &'a S,
    protocol: Protocol,
    key: &'a str,
    cut: Option<(u64, Cut)>,
    history: History,
    other: LockManager,
    /// The relays the victim's connections go through, counted and cut together.
    relays: Arc<Vec<Relay>>,
    victim_id: String,
    victim: LockManager,
    /// The lock's path on the server.
    path: String,
    /// How many job bodies ran, the victim's and the other's.
    bodies: Arc<AtomicUsize>,
}

impl<'a, S: LeaseServer> RelayRun<'a, S> {
    async fn start(
        server: &'a S,
        protocol: Protocol,
        key: &'a str,
        cut: Option<(u64, Cut)>,
    ) -> RelayRun<'a, S> {
        let url = server.url();
        let other = lease_manager::<S>(&url, &format!("other-{key}"), true).await;
        let (relays, victim_url) = server.victim_route().await;
        let victim_id = format!("victim-{key}");
        let victim = lease_manager::<S>(&victim_url, &victim_id, protocol.tokens()).await;
        let path = server.lock_path(&other, protocol, key);
        RelayRun {
            server,
            protocol,
            key,
            cut,
            history: History::new(),
            other,
            relays,
            victim_id,
            victim,
            path,
            bodies: Arc::new(AtomicUsize::new(0)),
        }
    }

    fn how(&self) -> Option<Cut> {
        self.cut.map(|(_, how)| how)
    }

    /// The victim's relays' first: they count and cut together.
    fn relay(&self) -> &Relay {
        &self.relays[0]
    }

    /// Ends the partition of every relay of the victim.
    fn heal(&self) {
        for relay in self.relays.iter() {
            relay.heal();
        }
    }

    /// The victim runs the protocol, cut after its k-th request (after the other process held
    /// first, for a hand-over). Answers the victim's task when it is cut off for good (`Kill`):
    /// it lives on, cut off, while the other process takes the lock; once the cut has fired.
    async fn victim_runs(&self) -> Option<JoinHandle<()>> {
        let first = if hands_over(self.protocol) {
            Some(hold_first(&self.history, &self.other, self.key).await)
        } else {
            None
        };
        if let Some((k, how)) = self.cut {
            let after = match how {
                Cut::Reset => After::Reset,
                Cut::Cancel => After::ResetAndBlackhole,
                Cut::Kill => After::Blackhole,
            };
            self.relay().cut_after_nth_request(k, after);
        }
        let run = self.spawn_victim();
        if let Some(first) = first {
            self.until_first_may_go(&run).await;
            release_first(first, self.key).await;
        }
        match self.how() {
            Some(Cut::Cancel) => drop_victim_when_stuck(run, STUCK).await,
            Some(Cut::Kill) => {
                // The cut has fired (or the protocol sent fewer requests this time).
                super::common::eventually("the cut", Duration::from_secs(10), || async {
                    !self.relay().cut_pending() || run.is_finished()
                })
                .await;
                return Some(run);
            }
            _ => run.await.expect("the victim's task"),
        }
        None
    }

    /// The victim's task: the protocol (a job run with its window), then a flush.
    fn spawn_victim(&self) -> JoinHandle<()> {
        // Cut off for good, the victim holds until it is told its hold is lost.
        let hold = if self.how() == Some(Cut::Kill) {
            WAIT * 2
        } else {
            HOLD
        };
        let protocol = self.protocol;
        let (victim, key, rec, bodies) = (
            self.victim.clone(),
            self.key.to_string(),
            self.history.recorder("victim"),
            self.bodies.clone(),
        );
        tokio::spawn(async move {
            if protocol == Protocol::Job {
                run_job(&victim, &key, &rec, &bodies, hold).await;
            } else {
                take_hold_release(protocol, &victim, &key, &rec, false, hold).await;
            }
            victim.flush().await;
        })
    }

    /// Until the first holder may let go: the victim gave up ([`Protocol::Abandon`]: its
    /// deadline passes even when it is cut off), or waits, or after a while if it never did.
    async fn until_first_may_go(&self, run: &JoinHandle<()>) {
        if self.protocol == Protocol::Abandon {
            let gave_up = || {
                self.history.events().iter().any(|e| {
                    e.worker == "victim"
                        && matches!(e.op, Op::AcquireFailed { .. } | Op::AcquireOk { .. })
                })
            };
            let _ = tokio::time::timeout(WAIT, async {
                while !gave_up() && !run.is_finished() {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
        } else {
            let _ = tokio::time::timeout(Duration::from_secs(2), async {
                while !self.server.waiting(&self.path).await {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
            .await;
        }
    }

    /// Another process takes the lock: within the lease of the cut, and its own retries. A
    /// job runs again only if the victim recorded no run, and its window never shrinks.
    async fn other_takes_the_lock(&self) {
        let (protocol, cut, key) = (self.protocol, self.cut, self.key);
        let other_rec = self.history.recorder("other");
        tokio::time::timeout(WAIT + S::LEASE, async {
            take_hold_release(protocol, &self.other, key, &other_rec, true, Duration::ZERO).await;
            if protocol == Protocol::Job {
                let window = self.server.window(&self.path).await;
                run_job(&self.other, key, &other_rec, &self.bodies, Duration::ZERO).await;
                let now = self.server.window(&self.path).await;
                assert!(
                    now >= window,
                    "{protocol:?}, cut {cut:?}: the at_least window shrank from {window:?} to {now:?}"
                );
            }
        })
        .await
        .unwrap_or_else(|_| panic!("{protocol:?} stuck after a cut {cut:?}"));
        self.other.flush().await;
    }

    /// A run skipped for a known bug: the victim ends (its manager dropped, as a process that
    /// exits), and what it left of the lock must go then, within the lease.
    async fn skip(self, victim_run: Option<JoinHandle<()>>) {
        let (protocol, cut, key) = (self.protocol, self.cut, self.key);
        if let Some(run) = victim_run {
            run.abort();
            let _ = run.await;
        }
        drop(self.victim);
        super::common::eventually(
            &format!("nothing of {key} left once the victim is gone ({protocol:?}, cut {cut:?})"),
            S::LEASE * 3,
            || async { self.server.left(&self.path).await.is_empty() },
        )
        .await;
    }

    /// The victim ends (a victim cut off for good dies now: nothing of it runs, and nothing of
    /// it reaches the server), and the run is judged: the history, a job's runs, and nothing
    /// left on the server once every process let go or its lease ran out.
    async fn end(self, victim_run: Option<JoinHandle<()>>) {
        let (protocol, cut, key) = (self.protocol, self.cut, self.key);
        if let Some(run) = victim_run {
            run.abort();
            let _ = run.await;
            self.history.crashed("victim");
            drop(self.victim);
            std::mem::forget(self.relays);
        } else {
            self.victim.flush().await;
        }
        assert_history_ok(&self.history, protocol, cut);
        if protocol == Protocol::Job {
            let ran = self.bodies.load(Ordering::SeqCst);
            assert!(
                ran <= 1,
                "{protocol:?}, cut {cut:?}: {ran} runs within one at_least window"
            );
            if cut.is_none() {
                assert_eq!(ran, 1, "the uncut job ran once, and the other skipped it");
            }
        }
        super::common::eventually(
            &format!("nothing of {key} left on the server ({protocol:?}, cut {cut:?})"),
            S::LEASE * 3,
            || async { self.server.left(&self.path).await.is_empty() },
        )
        .await;
        if cut.is_some_and(|(_, how)| how == Cut::Kill) {
            super::common::eventually(
                &format!("no session of the killed victim left ({protocol:?}, cut {cut:?})"),
                S::LEASE * 3,
                || async { self.server.sessions_left(&self.victim_id).await.is_empty() },
            )
            .await;
        }
    }
}

/// One test per protocol, each a sweep on a server of its own by `$sweep` (an
/// `async fn(Protocol, usize)`): `name: Protocol, offset;` (the offset rotates the kinds of
/// cut over the request boundaries).
macro_rules! sweep_tests {
    ($sweep:ident { $($name:ident: $protocol:ident, $offset:literal;)* }) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                $sweep($crate::cuts::Protocol::$protocol, $offset).await;
            }
        )*
    };
}
pub(crate) use sweep_tests;
