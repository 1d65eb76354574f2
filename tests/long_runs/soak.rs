//! A bounded soak: mixed mutex and read/write traffic from four sessions against a 3-node
//! ensemble, each session behind its own fault-injecting proxies, with Curator clients taking the
//! same locks, while random faults from the fault scenarios are injected one after another: the
//! leader killed or isolated, a follower restarted, a client partitioned past its session timeout,
//! its connections reset, the reply to its create lost, its session expired from another handle, a
//! storm of cancelled acquires — and the faults of the session and path epochs:
//!
//! - a guard kept after its loss: a worker keeps its guard across a session expiry of its manager,
//!   goes on acquiring with the same manager while it still keeps the lost guard, and drops it later;
//! - lock paths that empty, are reaped by the servers' container reaper (run every 250 ms here) and
//!   are re-created: the keys of each slot rotate among three names, so each name rests long enough
//!   to be reaped and then comes back with sequence numbers from 0;
//! - releases cancelled (`timeout(short, guard.release())`) while the client's connections are reset
//!   or blackholed;
//! - a session timeout clamped by the ensemble's `maxSessionTimeout`: a disconnect grace that fits
//!   the timeout asked for but not the one granted is refused, and the soak goes on with one that fits;
//! - Curator clients (`CuratorHold`: Curator's mutex, read and write locks) on the same paths, their
//!   holds fed into the history so that the checker sees every holder.
//!
//! It ends in a report — operations, faults injected, violations (must be 0), leaked nodes and
//! leaked watches (must be 0), and the counters of the faults above — printed even when the test
//! passes. On a violation the whole history is written to a file named in the output.
//!
//! 60 seconds of faults by default (plus start-up, a first Curator run that may install and compile
//! the peer, and the drain); `ZKLOCK_SOAK_SECS=600 cargo test --test long_runs -- soak::` soaks
//! longer, and `ZKLOCK_SOAK_SEED=<n>` replays a fault schedule.

use crate::common;
use crate::faults;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use common::say;
use faults::*;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use zklock::{DisconnectPolicy, Error, LockGuard, LockManager};
use zklock_testkit::{
    epoch_ms_to_ns, CuratorHold, History, Mode, Op, Proxy, Recorder, Report, ZkCluster, NO_TOKEN,
};

const SESSION: Duration = Duration::from_secs(4);
const QUORUM: Duration = Duration::from_secs(60);
/// The ensemble's `maxSessionTimeout`.
const MAX_SESSION: Duration = Duration::from_secs(8);
/// What the clamped client asks for: the ensemble grants [`MAX_SESSION`].
const CLAMPED_ASK: Duration = Duration::from_secs(16);
/// Fits [`CLAMPED_ASK`] but not [`MAX_SESSION`]: connect must refuse it.
const REFUSED_GRACE: Duration = Duration::from_secs(5);
/// The grace of the lenient clients (fits both session timeouts).
const GRACE: Duration = Duration::from_secs(1);
/// How often the leader reaps empty container nodes (ZooKeeper's default is a minute).
const REAPER_MS: u32 = 250;
/// Lock slots: two mutexes and one read/write lock; each slot's key rotates among
/// [`NAMES_PER_SLOT`] names.
const SLOTS: [&str; 3] = ["a", "b", "rw"];
const RW_SLOT: usize = 2;
const NAMES_PER_SLOT: u64 = 3;
/// A worker that keeps its guard waits this long, at most, to be told it is lost.
const KEEP_BOUND: Duration = Duration::from_secs(30);
/// Curator peers: rounds per JVM and how long each hold lasts.
const CURATOR_ROUNDS: u32 = 8;
const CURATOR_HOLD_MS: u64 = 20;
const CURATOR_EVENT: Duration = Duration::from_secs(45);
/// The first Curator run may install Curator and compile the peer.
const CURATOR_WARMUP: Duration = Duration::from_secs(300);
/// How many kinds of fault the driver deals, and the kind that keeps a guard past its loss.
const FAULT_KINDS: u32 = 10;
const KEPT_GUARD: u32 = 8;

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The current key of each slot; the driver rotates them.
#[derive(Default)]
struct Keys {
    generation: [AtomicU64; 3],
}

impl Keys {
    fn name(slot: usize, generation: u64) -> String {
        format!("soak-{}{}", SLOTS[slot], generation % NAMES_PER_SLOT)
    }

    fn current(&self, slot: usize) -> String {
        Keys::name(slot, self.generation[slot].load(Ordering::SeqCst))
    }

    fn rotate(&self, slot: usize) {
        self.generation[slot].fetch_add(1, Ordering::SeqCst);
    }

    /// Moves the slot on to the name `key` has (or, with `away`, to the name after it).
    fn turn_to(&self, slot: usize, key: &str, away: bool) {
        let index = (0..NAMES_PER_SLOT)
            .find(|g| Keys::name(slot, *g) == key)
            .expect("a key of the slot");
        let want = (index + u64::from(away)) % NAMES_PER_SLOT;
        let _ = self.generation[slot].fetch_update(Ordering::SeqCst, Ordering::SeqCst, |g| {
            Some(g + 1 + (want + NAMES_PER_SLOT - (g + 1) % NAMES_PER_SLOT) % NAMES_PER_SLOT)
        });
    }

    /// The slot whose key `history_key` is.
    fn slot_of(history_key: &str) -> (usize, String) {
        match history_key.strip_prefix("rw:") {
            Some(key) => (RW_SLOT, key.to_string()),
            None => (
                (0..RW_SLOT)
                    .find(|s| Keys::all(*s).iter().any(|k| k == history_key))
                    .expect("a slot's key"),
                history_key.to_string(),
            ),
        }
    }

    /// Every key a slot can have.
    fn all(slot: usize) -> Vec<String> {
        (0..NAMES_PER_SLOT).map(|g| Keys::name(slot, g)).collect()
    }
}

/// The key the history records a hold under: read/write locks apart from mutexes.
fn history_key(slot: usize, key: &str) -> String {
    if slot == RW_SLOT {
        format!("rw:{key}")
    } else {
        key.to_string()
    }
}

/// The lock path of a slot's key, as Curator must use it.
fn lock_path(m: &LockManager, slot: usize, key: &str) -> String {
    if slot == RW_SLOT {
        m.rwlock(key).expect("a valid key").path().to_string()
    } else {
        m.path_of(key).expect("a valid key")
    }
}

/// Counters of the new faults, for the report.
#[derive(Default)]
struct Counters {
    /// Guards kept by their worker after they were reported lost.
    kept: AtomicU64,
    /// Kept guards whose loss was never reported (must be 0).
    kept_never_lost: AtomicU64,
    /// Kept guards that said they were held again when dropped (must be 0).
    kept_revived: AtomicU64,
    /// Grants a manager made while one of its workers kept a lost guard.
    beside_kept: AtomicU64,
    /// Of those, grants of the very lock the kept guard is of.
    beside_kept_same_key: AtomicU64,
    /// Kept guards whose lock path was seen reaped and re-created (with traffic on it) before
    /// they were dropped.
    kept_across_reap: AtomicU64,
    /// Releases dropped by their timeout before they finished.
    cancelled_releases: AtomicU64,
    /// Lock paths seen gone after they existed (reaped), and seen again with a new czxid.
    reaped: AtomicU64,
    recreated: AtomicU64,
    /// Holds of the Curator peers, and peers that stopped answering.
    curator_holds: AtomicU64,
    curator_failures: AtomicU64,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::SeqCst);
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::SeqCst)
}

/// What a worker that keeps its guard tells the driver.
#[derive(Debug)]
enum Kept {
    Holding {
        worker: String,
        key: String,
    },
    /// The guard is lost and kept: sending on `drop` drops it; dropping `drop` lets it be
    /// dropped a few seconds later.
    Lost {
        drop: oneshot::Sender<()>,
    },
    NeverLost,
}

/// The driver's handles on one session's workers.
struct Ctl {
    /// The next worker of this session to get a grant keeps it past its loss.
    keep: AtomicBool,
    kept: mpsc::UnboundedSender<Kept>,
    /// Lost guards the session's workers still keep, and their (history) keys.
    kept_alive: AtomicU64,
    kept_keys: StdMutex<Vec<(String, Arc<AtomicU64>)>>,
    /// Until then, releases are given a short timeout.
    cancel_releases_until: StdMutex<Option<Instant>>,
}

impl Ctl {
    fn cancelling_releases(&self) -> bool {
        self.cancel_releases_until
            .lock()
            .unwrap()
            .is_some_and(|until| Instant::now() < until)
    }
}

/// What every worker shares.
#[derive(Clone)]
struct Ctx {
    crew: Crew,
    keys: Arc<Keys>,
    counters: Arc<Counters>,
    droppers: Arc<StdMutex<Vec<JoinHandle<()>>>>,
    work: Work,
}

struct Client {
    manager: LockManager,
    proxies: Vec<Proxy>,
    workers: Vec<String>,
    /// The negotiated session timeout.
    session: Duration,
    ctl: Arc<Ctl>,
    kept: tokio::sync::Mutex<mpsc::UnboundedReceiver<Kept>>,
}

async fn acquire(
    m: &LockManager,
    slot: usize,
    key: &str,
    write: bool,
    wait: Duration,
) -> zklock::Result<LockGuard> {
    if slot == RW_SLOT {
        let rw = m.rwlock(key)?;
        if write {
            Ok(rw.write_timeout(wait).await?)
        } else {
            Ok(rw.read_timeout(wait).await?)
        }
    } else {
        Ok(m.lock_timeout(key, wait).await?)
    }
}

/// Takes the slot's current key again and again until the crew stops (on the read/write slot,
/// one write in three). On some rounds it keeps its guard past the loss, or has its release
/// cancelled, as the driver asks.
async fn worker(m: LockManager, slot: usize, rec: Recorder, ctx: Ctx, ctl: Arc<Ctl>) {
    let mut rng = StdRng::from_entropy();
    while !ctx.crew.stopped() {
        let key = ctx.keys.current(slot);
        let hkey = history_key(slot, &key);
        let write = slot != RW_SLOT || rng.gen_range(0..3) == 0;
        let mode = if write { Mode::Exclusive } else { Mode::Shared };
        rec.acquire_invoked(&hkey, mode);
        match acquire(&m, slot, &key, write, ctx.work.wait).await {
            Ok(guard) => {
                rec.acquire_ok(&hkey, mode, guard.fencing_token().as_u128());
                bump(&ctx.crew.grants);
                if get(&ctl.kept_alive) > 0 {
                    bump(&ctx.counters.beside_kept);
                    for (_, same) in ctl.kept_keys.lock().unwrap().iter().filter(|k| k.0 == hkey) {
                        bump(same);
                        bump(&ctx.counters.beside_kept_same_key);
                    }
                }
                if ctl.keep.swap(false, Ordering::SeqCst) {
                    keep_past_loss(guard, &hkey, &rec, &ctx, &ctl, &mut rng).await;
                } else {
                    hold_and_release(guard, &hkey, &rec, &ctx, &ctl, &mut rng).await;
                }
            }
            Err(e) => {
                rec.acquire_failed(&hkey, mode, e);
                bump(&ctx.crew.failures);
            }
        }
        let think = rng.gen_range(Duration::ZERO..=ctx.work.think);
        tokio::time::sleep(think).await;
    }
}

/// Holds for a while (stopping at once when the hold is reported lost), then releases — with a
/// short timeout while the driver cancels this session's releases.
async fn hold_and_release(
    guard: LockGuard,
    key: &str,
    rec: &Recorder,
    ctx: &Ctx,
    ctl: &Ctl,
    rng: &mut StdRng,
) {
    let hold = rng.gen_range(Duration::ZERO..=ctx.work.hold);
    tokio::select! {
        biased;
        reason = guard.lost() => {
            rec.lost(key, reason);
            bump(&ctx.crew.losses);
        }
        _ = tokio::time::sleep(hold) => {}
    }
    rec.release_invoked(key);
    if ctl.cancelling_releases() {
        let within = Duration::from_micros(rng.gen_range(0..3_000));
        match tokio::time::timeout(within, guard.release()).await {
            Ok(Ok(())) => rec.release_ok(key),
            Ok(Err(e)) => rec.release_failed(key, e),
            Err(_) => bump(&ctx.counters.cancelled_releases),
        }
    } else {
        match guard.release().await {
            Ok(()) => rec.release_ok(key),
            Err(e) => rec.release_failed(key, e),
        }
    }
}

/// Keeps the guard across the session expiry the driver causes: records the loss when it is
/// reported (the worker stops acting under the hold), then hands the lost guard to a task that
/// keeps it a few seconds more while this worker goes on acquiring with the same manager.
async fn keep_past_loss(
    guard: LockGuard,
    key: &str,
    rec: &Recorder,
    ctx: &Ctx,
    ctl: &Arc<Ctl>,
    rng: &mut StdRng,
) {
    let _ = ctl.kept.send(Kept::Holding {
        worker: rec.worker().to_string(),
        key: key.to_string(),
    });
    match tokio::time::timeout(KEEP_BOUND, guard.lost()).await {
        Ok(reason) => {
            rec.lost(key, reason);
            bump(&ctx.crew.losses);
            bump(&ctx.counters.kept);
            ctl.kept_alive.fetch_add(1, Ordering::SeqCst);
            let same = Arc::new(AtomicU64::new(0));
            ctl.kept_keys
                .lock()
                .unwrap()
                .push((key.to_string(), same.clone()));
            let (kept_key, keeper) = (key.to_string(), rec.worker().to_string());
            let kept_at = Instant::now();
            let keep_for = Duration::from_millis(rng.gen_range(500..8_000));
            let (ctl2, counters) = (ctl.clone(), ctx.counters.clone());
            let (drop_tx, drop_rx) = oneshot::channel();
            let dropper = tokio::spawn(async move {
                let _ = tokio::time::timeout(KEEP_BOUND, async {
                    if drop_rx.await.is_err() {
                        tokio::time::sleep(keep_for).await;
                    }
                })
                .await;
                if guard.is_held() || guard.loss_reason().is_none() {
                    bump(&counters.kept_revived);
                }
                drop(guard);
                let mut keys = ctl2.kept_keys.lock().unwrap();
                if let Some(i) = keys.iter().position(|k| Arc::ptr_eq(&k.1, &same)) {
                    keys.remove(i);
                }
                say(&format!(
                    "soak: {keeper} kept its lost guard on {kept_key} for {:.1} s; its manager was \
                     granted {kept_key} {} times meanwhile",
                    kept_at.elapsed().as_secs_f64(),
                    get(&same)
                ));
                ctl2.kept_alive.fetch_sub(1, Ordering::SeqCst);
            });
            ctx.droppers.lock().unwrap().push(dropper);
            let _ = ctl.kept.send(Kept::Lost { drop: drop_tx });
        }
        Err(_) => {
            say(&format!(
                "soak: {} kept its guard on {key}: no loss reported {KEEP_BOUND:?} after the expiry",
                rec.worker()
            ));
            bump(&ctx.counters.kept_never_lost);
            let _ = ctl.kept.send(Kept::NeverLost);
            rec.release_invoked(key);
            let _ = guard.release().await;
        }
    }
}

/// One acquire abandoned (or not) at a random point, recorded.
async fn cancelled_acquire(m: LockManager, key: String, rec: Recorder, after: Duration) {
    rec.acquire_invoked(&key, Mode::Exclusive);
    match tokio::time::timeout(after, m.lock(&key)).await {
        Ok(Ok(guard)) => {
            rec.acquire_ok(&key, Mode::Exclusive, guard.fencing_token().as_u128());
            rec.release_invoked(&key);
            drop(guard);
        }
        Ok(Err(e)) => rec.acquire_failed(&key, Mode::Exclusive, e),
        Err(_) => rec.acquire_failed(&key, Mode::Exclusive, "dropped"),
    }
}

/// Counts the lock paths that vanish (reaped once empty) and come back with a new czxid.
async fn watch_reaping(
    client: zklock::zookeeper_client::Client,
    paths: Vec<String>,
    counters: Arc<Counters>,
    stop: Arc<AtomicBool>,
) {
    // Per path: the czxid last seen (None: absent), and whether it was ever reaped.
    let mut seen: HashMap<String, (Option<i64>, bool)> = HashMap::new();
    while !stop.load(Ordering::SeqCst) {
        for path in &paths {
            let Ok(stat) = client.check_stat(path).await else {
                continue;
            };
            let now = stat.map(|s| s.czxid);
            let (last, reaped) = seen.entry(path.clone()).or_insert((None, false));
            match (*last, now) {
                (Some(_), None) => {
                    bump(&counters.reaped);
                    *reaped = true;
                }
                (Some(a), Some(b)) if a != b => {
                    bump(&counters.reaped);
                    bump(&counters.recreated);
                    *reaped = true;
                }
                (None, Some(_)) if *reaped => bump(&counters.recreated),
                _ => {}
            }
            *last = now;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs Curator peers one after another until the crew stops, each taking a slot's current
/// key `CURATOR_ROUNDS` times (Curator's mutex, read or write lock), and records their holds
/// with the times they print: a grant from the millisecond after "acquired" (printed once
/// `acquire()` returned), a release at the millisecond of "released" (printed before
/// `release()`), so each recorded hold lies inside the real one.
fn curator_peers(
    connect: String,
    paths: HashMap<(usize, String), String>,
    keys: Arc<Keys>,
    history: History,
    counters: Arc<Counters>,
    crew: Crew,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed ^ 0xc0de);
    let mut batch = 0u64;
    while !crew.stopped() {
        let (mode, slot) = match rng.gen_range(0..4) {
            0 | 1 => ("mutex", rng.gen_range(0..RW_SLOT)),
            2 => ("read", RW_SLOT),
            _ => ("write", RW_SLOT),
        };
        let hmode = if mode == "read" {
            Mode::Shared
        } else {
            Mode::Exclusive
        };
        let key = keys.current(slot);
        let hkey = history_key(slot, &key);
        let path = &paths[&(slot, key.clone())];
        let name = format!("curator-{batch}");
        let rec = history.recorder(&name);
        let mut peer = CuratorHold::spawn(&connect, path, mode, CURATOR_HOLD_MS, CURATOR_ROUNDS)
            .expect("start a Curator peer");
        let mut holding = false;
        let mut events = 0;
        while events < 2 * CURATOR_ROUNDS {
            match peer.next_event(CURATOR_EVENT) {
                Ok((event, ms)) if event == "acquired" => {
                    let at = epoch_ms_to_ns(ms + 1);
                    rec.record_at(at - 1, &hkey, hmode, Op::AcquireInvoked);
                    rec.record_at(at, &hkey, hmode, Op::AcquireOk { token: NO_TOKEN });
                    bump(&counters.curator_holds);
                    holding = true;
                }
                Ok((_, ms)) => {
                    rec.record_at(epoch_ms_to_ns(ms), &hkey, hmode, Op::ReleaseInvoked);
                    holding = false;
                }
                Err(e) => {
                    say(&format!(
                        "soak: Curator peer {name} on {path} ({mode}): {e}"
                    ));
                    bump(&counters.curator_failures);
                    if holding {
                        history.crashed(&name);
                    }
                    break;
                }
            }
            events += 1;
        }
        if events == 2 * CURATOR_ROUNDS {
            let _ = peer.wait();
        }
        batch += 1;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_random_faults_under_mixed_traffic() {
    let (secs, seed) = common::soak_settings("soak", 60);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut soak = Soak::start().await;
    let background = soak.watch_and_run_curator(seed);
    soak.ctx
        .crew
        .until_grants(0, 20, Duration::from_secs(30))
        .await;

    let started = Instant::now();
    let injected = soak
        .deal_faults(&mut rng, started + Duration::from_secs(secs))
        .await;
    soak.drain(background.curator).await;

    let report = soak.history.check();
    let leaks = soak.leaks().await;
    background.watching.store(true, Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(30), background.reaping)
        .await
        .expect("the reaping watch stops")
        .unwrap();
    soak.say_report(&report, seed, started, &injected, &leaks);
    soak.assert_report(&report, &injected, &leaks, secs);
}

/// What the soak's phases share: the ensemble, the four clients and their workers, the
/// history.
struct Soak {
    cluster: ZkCluster,
    /// The ensemble's connect string, without proxies.
    direct: String,
    /// A session straight to the ensemble, that looks at the servers.
    admin: LockManager,
    history: History,
    ctx: Ctx,
    clients: Vec<Client>,
    tasks: Vec<JoinHandle<()>>,
    /// Why the clamped client's grace was refused.
    refusal: String,
    /// The lock paths of every key the slots rotate through.
    paths: HashMap<(usize, String), String>,
    /// Storms of cancelled acquires so far.
    storms: AtomicU64,
}

/// The soak's background tasks: the watch of reaped paths (stopped by `watching`) and the
/// Curator peers (stopped with the crew).
struct Background {
    watching: Arc<AtomicBool>,
    reaping: JoinHandle<()>,
    curator: JoinHandle<()>,
}

/// Leaks: contender nodes still there once every session has settled, and watches the
/// servers still keep for the lock paths.
struct Leaks {
    nodes: Vec<String>,
    watches: Vec<String>,
}

impl Soak {
    /// The ensemble, a first Curator run, and four clients with their workers running.
    async fn start() -> Soak {
        let cluster = blocking(|| {
            ZkCluster::builder(3)
                .max_session_timeout(MAX_SESSION.as_millis() as u32)
                .container_check_interval(REAPER_MS)
                .start()
        })
        .unwrap();
        let direct = cluster.connect_string();
        let admin = LockManager::builder(&direct)
            .zookeeper(|zk| zk.session_timeout(Duration::from_secs(20)))
            .connect()
            .await
            .unwrap();
        warm_up_curator(&direct);

        let history = History::new();
        let ctx = Ctx {
            crew: Crew::new(),
            keys: Arc::new(Keys::default()),
            counters: Arc::new(Counters::default()),
            droppers: Arc::new(StdMutex::new(Vec::new())),
            work: Work {
                wait: Duration::from_secs(20),
                hold: Duration::from_millis(15),
                think: Duration::from_millis(10),
            },
        };

        // Four sessions, each through its own proxy to every member; two treat a disconnection
        // as a loss, two have a grace well under the session timeout. The last asks for a
        // longer session than the ensemble grants: the grace that fits what it asked for is
        // refused.
        let mut clients = Vec::new();
        let mut tasks = Vec::new();
        let mut refusal = None;
        for i in 0..4 {
            let (client, workers, refused) = start_client(i, &cluster, &history, &ctx).await;
            clients.push(client);
            tasks.extend(workers);
            refusal = refusal.or(refused);
        }
        let refusal = refusal.expect("the clamped client's grace was refused");

        let mut paths = HashMap::new();
        for slot in 0..SLOTS.len() {
            for key in Keys::all(slot) {
                paths.insert((slot, key.clone()), lock_path(&admin, slot, &key));
            }
        }
        Soak {
            cluster,
            direct,
            admin,
            history,
            ctx,
            clients,
            tasks,
            refusal,
            paths,
            storms: AtomicU64::new(0),
        }
    }

    /// Starts the watch of reaped paths and the Curator peers.
    fn watch_and_run_curator(&self, seed: u64) -> Background {
        let counters = self.ctx.counters.clone();
        let watching = Arc::new(AtomicBool::new(false));
        let reaping = tokio::spawn(watch_reaping(
            self.admin
                .client::<zookeeper_client::Client>()
                .expect("a ZooKeeper manager"),
            self.paths.values().cloned().collect(),
            counters.clone(),
            watching.clone(),
        ));
        let curator = tokio::task::spawn_blocking({
            let (direct, keys) = (self.direct.clone(), self.ctx.keys.clone());
            let history = self.history.clone();
            let (crew, paths) = (self.ctx.crew.clone(), self.paths.clone());
            move || curator_peers(direct, paths, keys, history, counters, crew, seed)
        });
        Background {
            watching,
            reaping,
            curator,
        }
    }

    /// Faults until `deadline`, one after another with traffic between them; answers how many
    /// of each kind.
    async fn deal_faults(
        &mut self,
        rng: &mut StdRng,
        deadline: Instant,
    ) -> BTreeMap<&'static str, u64> {
        let mut injected: BTreeMap<&'static str, u64> = BTreeMap::new();
        let mut rotation = 0;
        // Faults are dealt from a shuffled deck, so that a 60 s run sees every kind.
        let mut deck: Vec<u32> = Vec::new();
        while Instant::now() < deadline {
            // Traffic between faults; one slot moves on to its next key, so each key rests (and
            // its path is reaped) for two rotations before it comes back.
            let calm = Duration::from_millis(rng.gen_range(1500..3000));
            tokio::time::sleep(calm).await;
            self.ctx.keys.rotate(rotation % SLOTS.len());
            rotation += 1;
            let c = rng.gen_range(0..self.clients.len());
            let before = self.ctx.crew.grants();
            if deck.is_empty() {
                // The guard kept past its loss twice: the fault the session epochs are for.
                deck = (0..FAULT_KINDS).chain([KEPT_GUARD]).collect();
                deck.shuffle(rng);
            }
            let kind = deck.pop().expect("a fault");
            let kind = self.inject(rng, kind, c, before).await;
            *injected.entry(kind).or_default() += 1;
            blocking(|| self.cluster.wait_for_quorum(QUORUM)).unwrap();
        }
        injected
    }

    /// One fault of `kind`, on client `c` where it is a client's; `before` is the crew's grants
    /// before it. Answers the fault's name.
    async fn inject(&mut self, rng: &mut StdRng, kind: u32, c: usize, before: u64) -> &'static str {
        let (history, crew) = (&self.history, &self.ctx.crew);
        let client = &self.clients[c];
        match kind {
            0 => {
                let leader = self.cluster.leader().expect("a leader");
                history.fault(&format!("killed the leader {leader}"));
                blocking(|| self.cluster.stop_member(leader)).unwrap();
                blocking(|| self.cluster.wait_for_quorum(QUORUM)).unwrap();
                crew.until_grants(before, 3, QUORUM).await;
                blocking(|| self.cluster.restart_member(leader)).unwrap();
                "kill leader"
            }
            1 => {
                let leader = self.cluster.leader().expect("a leader");
                history.fault(&format!("isolated the leader {leader}"));
                blocking(|| self.cluster.pause_member(leader)).unwrap();
                blocking(|| self.cluster.wait_for_quorum(QUORUM)).unwrap();
                crew.until_grants(before, 3, QUORUM).await;
                blocking(|| self.cluster.resume_member(leader)).unwrap();
                "isolate leader"
            }
            2 => {
                let leader = self.cluster.leader();
                let follower = (0..self.cluster.len())
                    .find(|i| Some(*i) != leader)
                    .unwrap();
                history.fault(&format!("restarted follower {follower}"));
                blocking(|| self.cluster.restart_member(follower)).unwrap();
                "restart follower"
            }
            3 => {
                history.fault(&format!("partitioned client {c} past its session timeout"));
                for p in &client.proxies {
                    p.blackhole();
                }
                tokio::time::sleep(client.session + Duration::from_secs(1)).await;
                for p in &client.proxies {
                    p.heal();
                }
                "partition client"
            }
            4 => {
                history.fault(&format!("reset client {c}'s connections"));
                for p in &client.proxies {
                    p.reset();
                }
                "reset connections"
            }
            5 => {
                history.fault(&format!("lose the reply to client {c}'s next create"));
                for p in &client.proxies {
                    p.drop_reply_to_nth_create(1);
                }
                "lost create reply"
            }
            6 => {
                common::expire_session_noting(&client.manager, &self.direct, || {
                    for w in &client.workers {
                        history.silent_fault(w, "session expired from another handle");
                    }
                })
                .await;
                "expire session"
            }
            7 => self.cancel_storm(rng).await,
            KEPT_GUARD => self.keep_guard(rng, c).await,
            _ => self.cancel_releases(rng, c).await,
        }
    }

    /// A storm of acquires, each dropped at a random point.
    async fn cancel_storm(&self, rng: &mut StdRng) -> &'static str {
        let n = self.storms.fetch_add(1, Ordering::SeqCst);
        self.history.fault("a storm of cancelled acquires");
        let mut storm = Vec::new();
        for k in 0..24 {
            let m = self.clients[k % self.clients.len()].manager.clone();
            let key = self.ctx.keys.current(k % RW_SLOT);
            let after = Duration::from_micros(rng.gen_range(0..30_000));
            storm.push(tokio::spawn(cancelled_acquire(
                m,
                key,
                self.history.recorder(&format!("storm-{n}-{k}")),
                after,
            )));
        }
        for t in storm {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("a storm acquire ends")
                .unwrap();
        }
        "cancel storm"
    }

    /// The next worker of client `c` to get a grant keeps it; its session is then expired, and
    /// it goes on acquiring beside the lost guard.
    async fn keep_guard(&self, rng: &mut StdRng, c: usize) -> &'static str {
        let (history, client) = (&self.history, &self.clients[c]);
        let mut kept = client.kept.lock().await;
        while kept.try_recv().is_ok() {}
        client.ctl.keep.store(true, Ordering::SeqCst);
        let mut holding = tokio::time::timeout(Duration::from_secs(15), kept.recv()).await;
        if holding.is_err() && !client.ctl.keep.swap(false, Ordering::SeqCst) {
            // A worker took it just now.
            holding = tokio::time::timeout(Duration::from_secs(5), kept.recv()).await;
        }
        let Ok(Some(Kept::Holding { worker, key })) = holding else {
            return "kept guard (no grant)";
        };
        history.fault(&format!(
            "client {c}'s {worker} keeps its guard on {key} across a session expiry"
        ));
        common::expire_session_noting(&client.manager, &self.direct, || {
            for w in &client.workers {
                history.silent_fault(w, "session expired from another handle (guard kept)");
            }
        })
        .await;
        let told = tokio::time::timeout(KEEP_BOUND + Duration::from_secs(5), kept.recv()).await;
        match told {
            Ok(Some(Kept::Lost { drop })) if rng.gen_ratio(2, 3) => {
                self.reap_while_kept(rng, &key, &worker).await;
                let _ = drop.send(());
            }
            Ok(Some(Kept::Lost { .. } | Kept::NeverLost)) => {}
            other => panic!("the keeper did not report: {other:?}"),
        }
        "kept guard"
    }

    /// While `worker` keeps its lost guard on `key`, the lock path empties, is reaped, and is
    /// re-created by the traffic (sequence numbers from 0 again).
    async fn reap_while_kept(&self, rng: &mut StdRng, key: &str, worker: &str) {
        let (slot, name) = Keys::slot_of(key);
        let path = &self.paths[&(slot, name.clone())];
        let zk = self
            .admin
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager");
        let stat = || async { zk.check_stat(path).await.ok().map(|s| s.map(|s| s.czxid)) };
        self.ctx.keys.turn_to(slot, &name, true);
        let old = stat().await.flatten();
        let until = Instant::now() + Duration::from_secs(10);
        let mut reaped = false;
        while !reaped && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
            reaped = stat().await == Some(None);
        }
        self.ctx.keys.turn_to(slot, &name, false);
        let until = Instant::now() + Duration::from_secs(10);
        let mut recreated = false;
        while reaped && !recreated && Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(50)).await;
            recreated = matches!(stat().await, Some(Some(c)) if Some(c) != old);
        }
        let traffic = Duration::from_millis(rng.gen_range(300..1500));
        tokio::time::sleep(traffic).await;
        if recreated {
            bump(&self.ctx.counters.kept_across_reap);
            self.history.fault(&format!(
                "{path} reaped and re-created while {worker} kept its lost guard"
            ));
        } else {
            say(&format!(
                "soak: {path} was not {} while {worker} kept its guard",
                if reaped { "re-created" } else { "reaped" }
            ));
        }
    }

    /// Client `c`'s releases cancelled by a short timeout while its connections are
    /// blackholed or reset.
    async fn cancel_releases(&self, rng: &mut StdRng, c: usize) -> &'static str {
        let client = &self.clients[c];
        let blackhole = rng.gen_bool(0.5);
        self.history.fault(&format!(
            "client {c}'s releases cancelled while its connections are {}",
            if blackhole { "blackholed" } else { "reset" }
        ));
        *client.ctl.cancel_releases_until.lock().unwrap() =
            Some(Instant::now() + Duration::from_secs(4));
        if blackhole {
            tokio::time::sleep(Duration::from_millis(rng.gen_range(100..600))).await;
            for p in &client.proxies {
                p.blackhole();
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(300..1500))).await;
            for p in &client.proxies {
                p.heal();
            }
            tokio::time::sleep(Duration::from_millis(rng.gen_range(500..1500))).await;
        } else {
            for _ in 0..8 {
                tokio::time::sleep(Duration::from_millis(rng.gen_range(50..400))).await;
                for p in &client.proxies {
                    p.reset();
                }
            }
        }
        *client.ctl.cancel_releases_until.lock().unwrap() = None;
        "cancelled releases"
    }

    /// Heals everything, lets the traffic show it recovered, then stops it: the workers, the
    /// kept guards, the Curator peers, the managers' background releases.
    async fn drain(&mut self, curator: JoinHandle<()>) {
        let crew = &self.ctx.crew;
        for client in &self.clients {
            for p in &client.proxies {
                p.heal();
            }
        }
        blocking(|| self.cluster.wait_for_quorum(QUORUM)).unwrap();
        crew.until_grants(crew.grants(), 10, QUORUM).await;
        crew.stop();
        for t in self.tasks.drain(..) {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("workers stop")
                .unwrap();
        }
        let droppers: Vec<_> = std::mem::take(&mut *self.ctx.droppers.lock().unwrap());
        for d in droppers {
            tokio::time::timeout(Duration::from_secs(30), d)
                .await
                .expect("kept guards are dropped")
                .unwrap();
        }
        tokio::time::timeout(CURATOR_EVENT * (2 * CURATOR_ROUNDS + 1), curator)
            .await
            .expect("the Curator peers stop")
            .unwrap();
        for client in &self.clients {
            tokio::time::timeout(Duration::from_secs(60), client.manager.flush())
                .await
                .expect("background releases finish");
        }
    }

    /// The leaks once every session has settled (waiting up to 20 s for them to go).
    async fn leaks(&self) -> Leaks {
        let leak_deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let nodes = contenders(
                &self
                    .admin
                    .client::<zookeeper_client::Client>()
                    .expect("a ZooKeeper manager"),
                ROOT,
            )
            .await;
            let watches: Vec<String> = (0..self.cluster.len())
                .filter_map(|i| self.cluster.member_four_letter(i, "wchp").ok())
                .flat_map(|w| watched_paths(&w, ROOT))
                .collect();
            if (nodes.is_empty() && watches.is_empty()) || Instant::now() > leak_deadline {
                return Leaks { nodes, watches };
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The report, printed even when the test passes; on a violation, the whole history
    /// written to a file named in the output.
    fn say_report(
        &self,
        report: &Report,
        seed: u64,
        started: Instant,
        injected: &BTreeMap<&'static str, u64>,
        leaks: &Leaks,
    ) {
        let counters = &self.ctx.counters;
        let faults: u64 = injected.values().sum();
        say(&format!(
            "soak report: {} s, seed {seed}: operations {} (acquires {}, failed acquires {}, \
             releases {}, losses reported {}), faults injected {faults} {injected:?}, violations {}, \
             unprotected windows {}, leaked nodes {}, leaked watches {}, kept guards {} (grants \
             beside a kept guard {} (same lock {}), kept across a reap {}, never reported lost {}, revived {}), reaped paths seen {} \
             (re-created {}), cancelled releases {}, curator holds {} (peers failed {}), clamped \
             session: asked {CLAMPED_ASK:?}, granted {:?}, grace {REFUSED_GRACE:?} refused, \
             {GRACE:?} used",
            started.elapsed().as_secs(),
            report.acquires_invoked + report.releases,
            report.acquires,
            report.acquire_failures,
            report.releases,
            report.losses,
            report.violations.len(),
            report.unprotected.len(),
            leaks.nodes.len(),
            leaks.watches.len(),
            get(&counters.kept),
            get(&counters.beside_kept),
            get(&counters.beside_kept_same_key),
            get(&counters.kept_across_reap),
            get(&counters.kept_never_lost),
            get(&counters.kept_revived),
            get(&counters.reaped),
            get(&counters.recreated),
            get(&counters.cancelled_releases),
            get(&counters.curator_holds),
            get(&counters.curator_failures),
            self.clients[3].session,
        ));
        say(&format!("soak: the refusal: {}", self.refusal));
        for overlap in &report.unprotected {
            say(&format!("soak: unprotected window: {overlap}"));
        }
        if !report.is_ok() {
            let file = std::env::temp_dir().join(format!("zklock-soak-{seed}.history"));
            let lines: String = self
                .history
                .events()
                .iter()
                .map(|e| e.to_line() + "\n")
                .collect();
            let _ = std::fs::write(&file, lines);
            say(&format!("soak: the history is in {}", file.display()));
        }
    }

    /// No violation, no leak, faults and traffic enough, kept guards lost and never held again,
    /// Curator in the traffic, and (in a run of 30 s or more) a lock path reaped and re-created.
    fn assert_report(
        &self,
        report: &Report,
        injected: &BTreeMap<&'static str, u64>,
        leaks: &Leaks,
        secs: u64,
    ) {
        let counters = &self.ctx.counters;
        let faults: u64 = injected.values().sum();
        report.assert_ok();
        let (leaked_nodes, leaked_watches) = (&leaks.nodes, &leaks.watches);
        assert!(leaked_nodes.is_empty(), "leaked nodes: {leaked_nodes:?}");
        assert!(
            leaked_watches.is_empty(),
            "leaked watches: {leaked_watches:?}"
        );
        assert!(faults > 0, "no fault was injected");
        assert!(
            report.acquires > 100,
            "too little traffic: {}",
            report.summary()
        );
        assert_eq!(
            get(&counters.kept_never_lost),
            0,
            "a kept guard was never lost"
        );
        assert_eq!(
            get(&counters.kept_revived),
            0,
            "a lost guard was held again"
        );
        assert!(get(&counters.curator_holds) > 0, "no Curator hold");
        if secs >= 30 {
            assert!(
                get(&counters.reaped) > 0 && get(&counters.recreated) > 0,
                "no lock path was reaped and re-created"
            );
        }
    }
}

/// A first Curator run, outside the timed window: it may install Curator and compile the peer.
fn warm_up_curator(direct: &str) {
    let warmup = Instant::now();
    blocking(|| {
        let mut peer = CuratorHold::spawn(direct, "/soak-warmup/lock", "mutex", 0, 1)?;
        peer.next_event(CURATOR_WARMUP)?;
        peer.next_event(CURATOR_EVENT)?;
        peer.wait()
    })
    .expect("a first Curator peer runs");
    say(&format!(
        "soak: Curator peer ready in {:.1} s",
        warmup.elapsed().as_secs_f64()
    ));
}

/// Client `i`: a session through its own proxy to every member (with a grace when `i` is odd;
/// the last one clamped), and a worker on each slot. Answers the client, its workers' tasks,
/// and for the clamped client the refusal of the grace that fits only what it asked for.
async fn start_client(
    i: usize,
    cluster: &ZkCluster,
    history: &History,
    ctx: &Ctx,
) -> (Client, Vec<JoinHandle<()>>, Option<String>) {
    let proxies: Vec<Proxy> = (0..cluster.len())
        .map(|j| Proxy::start(&cluster.member_connect_string(j)).unwrap())
        .collect();
    let connect = proxies
        .iter()
        .map(Proxy::connect_string)
        .collect::<Vec<_>>()
        .join(",");
    let clamped = i == 3;
    let ask = if clamped { CLAMPED_ASK } else { SESSION };
    let refusal = if clamped {
        Some(refused_grace(&connect, ask).await)
    } else {
        None
    };
    let mut builder = LockManager::builder(connect).zookeeper(|zk| zk.session_timeout(ask));
    if i % 2 == 1 {
        builder = builder.zookeeper(|zk| zk.disconnect_policy(DisconnectPolicy::Grace(GRACE)));
    }
    let manager = builder.connect().await.unwrap();
    let session = manager.lease().expect("a ZooKeeper session");
    if clamped {
        assert_eq!(session, MAX_SESSION, "the ensemble clamps the session");
    }
    let (kept_tx, kept_rx) = mpsc::unbounded_channel();
    let ctl = Arc::new(Ctl {
        keep: AtomicBool::new(false),
        kept: kept_tx,
        kept_alive: AtomicU64::new(0),
        kept_keys: StdMutex::new(Vec::new()),
        cancel_releases_until: StdMutex::new(None),
    });
    let mut tasks = Vec::new();
    let mut workers = Vec::new();
    for (slot, name) in SLOTS.iter().enumerate() {
        let name = format!("c{i}/{name}");
        tasks.push(tokio::spawn(worker(
            manager.clone(),
            slot,
            history.recorder(&name),
            ctx.clone(),
            ctl.clone(),
        )));
        workers.push(name);
    }
    let client = Client {
        manager,
        proxies,
        workers,
        session,
        ctl,
        kept: tokio::sync::Mutex::new(kept_rx),
    };
    (client, tasks, refusal)
}

/// Connect refuses [`REFUSED_GRACE`] with a session of `ask` that the ensemble clamps below
/// it, naming the grace; answers its message.
async fn refused_grace(connect: &str, ask: Duration) -> String {
    let refused = LockManager::builder(connect)
        .zookeeper(|zk| {
            zk.session_timeout(ask)
                .disconnect_policy(DisconnectPolicy::Grace(REFUSED_GRACE))
        })
        .connect()
        .await;
    match refused {
        Err(Error::Config(msg)) => {
            assert!(
                msg.contains(&format!("grace of {REFUSED_GRACE:?}")),
                "the refusal does not name the grace: {msg}"
            );
            msg
        }
        Err(e) => panic!("a grace that fits only the asked session: {e}"),
        Ok(m) => panic!(
            "a grace of {REFUSED_GRACE:?} was accepted with a session of {:?}",
            m.lease()
        ),
    }
}

/// The progress invariant: with finite holds and no fault, grants keep coming. One process, two
/// managers (two sessions), eight tasks each, taking and releasing three keys in turn as fast as
/// they can — the loop in which a lost wake-up once stopped every task for good (a task handed
/// the lock locally waited for ever for a confirmation it had already consumed, holding the
/// node that everyone else queued behind). A watchdog fails the test when no grant comes for
/// [`STALL`]; two believed holders of one key fail it too.
///
/// 20 seconds by default;
/// `ZKLOCK_PROGRESS_SECS=120 cargo test --test long_runs -- soak::grants_keep` runs longer (the
/// stall it guards against came after 60,000–200,000 cycles on a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_keep_coming_in_a_plain_contended_loop() {
    /// No grant of any key for this long, with no fault and holds of microseconds, is a stall.
    const STALL: Duration = Duration::from_secs(10);
    const KEYS: [&str; 3] = ["p0", "p1", "p2"];
    let secs: u64 = std::env::var("ZKLOCK_PROGRESS_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20)
        .max(2);
    let server = common::server();
    let connect = server.connect_string();
    let managers = [
        common::manager(&connect).await,
        common::manager(&connect).await,
    ];
    let start = Instant::now();
    let grants = Arc::new(AtomicU64::new(0));
    let last_grant_ms = Arc::new(AtomicU64::new(0));
    let holders: Arc<Vec<AtomicU64>> = Arc::new(KEYS.iter().map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let mut tasks = vec![];
    for (m_index, m) in managers.iter().enumerate() {
        for t in 0..8usize {
            let (m, grants, last, holders, stop) = (
                m.clone(),
                grants.clone(),
                last_grant_ms.clone(),
                holders.clone(),
                stop.clone(),
            );
            tasks.push(tokio::spawn(async move {
                let mut turn = (m_index + t) % KEYS.len();
                while !stop.load(Ordering::SeqCst) {
                    let guard = m.lock(KEYS[turn]).await.expect("lock");
                    let inside = holders[turn].fetch_add(1, Ordering::SeqCst);
                    assert_eq!(inside, 0, "two holders of {} at once", KEYS[turn]);
                    grants.fetch_add(1, Ordering::SeqCst);
                    last.store(start.elapsed().as_millis() as u64, Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    holders[turn].fetch_sub(1, Ordering::SeqCst);
                    drop(guard);
                    turn = (turn + 1) % KEYS.len();
                }
            }));
        }
    }
    let run = Duration::from_secs(secs);
    while start.elapsed() < run {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let since = start
            .elapsed()
            .saturating_sub(Duration::from_millis(last_grant_ms.load(Ordering::SeqCst)));
        if since > STALL {
            let mut status = String::new();
            for key in KEYS {
                let path = format!("{}/{key}", managers[0].namespace());
                status += &format!(
                    "{path}: {:?}\n",
                    common::children(&managers[0], &path).await
                );
            }
            panic!(
                "no grant for {since:?} after {} grants ({:?} into the run): a stall\n{status}",
                grants.load(Ordering::SeqCst),
                start.elapsed()
            );
        }
    }
    stop.store(true, Ordering::SeqCst);
    for task in tasks {
        tokio::time::timeout(STALL, task)
            .await
            .expect("every task ends once told to stop (a task stuck in lock() is a stall)")
            .expect("task");
    }
    let total = grants.load(Ordering::SeqCst);
    say(&format!(
        "progress: {total} grants in {secs} s ({:.0}/s), no stall",
        total as f64 / secs as f64
    ));
    assert!(total > 0, "no grant at all");
}
