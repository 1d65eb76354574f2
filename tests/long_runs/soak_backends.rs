//! A bounded soak of the Redis, PostgreSQL, etcd and MySQL backends: mixed traffic from three managers
//! whose settings differ (leases of 1 s (2 s on etcd), 3 s and 10 s; a linger of 0 or 300 ms; the local queue on or
//! off) — mutex workers on two keys, readers and writers of one read/write lock, a scheduled job
//! with an `at_least` window and a leader election — while faults are dealt at random, one after
//! another, with traffic in between:
//!
//! - Redis: the holder's key deleted from outside (`DEL zklock:lock:<path>`, as a failover to a
//!   replica that never got it would), `CLIENT KILL TYPE normal` and `TYPE pubsub` (every
//!   command or pub/sub connection cut), the server restarted (with its append-only file; and,
//!   in `soak_redis_restarts_without_persistence`, ignored for now, without persistence: empty),
//!   the server paused past the shortest lease;
//! - PostgreSQL: a holding session ended by the server (`pg_terminate_backend`), the server
//!   restarted (killed, and started again on its data), the server paused past the shortest lease;
//! - MySQL: a holding session ended from outside (`KILL`), the server restarted (killed, and
//!   started again on its data), the server paused past the shortest lease (the backend has no
//!   read/write locks: no reader or writer workers);
//! - etcd: a holder's key deleted from outside, a holder's lease revoked from outside (every hold
//!   of its manager lost at once), the server restarted (on its data), the server paused past
//!   the shortest lease.
//!
//! Every hold is recorded in a history (grant with its fencing token, loss as soon as the guard
//! reports it — the worker stops acting under it then —, release), every job run with its window,
//! every leadership with its epoch; the checker then decides: no two believed holders of a key, tokens
//! strictly increasing, no job run within an earlier run's `at_least` window. Deleting a holder's
//! key and ending its session are silent faults for the workers of the keys they hit (another
//! process may be granted the lock before the holder can learn of it; see
//! `History::silent_fault`); a restart, a cut connection and a pause excuse nothing.
//!
//! Then the progress invariant: once the last fault is over, with holds of milliseconds, every
//! worker is granted again within [`PROGRESS_BOUND`] (a job worker: its job runs or is skipped by
//! a decision, and the job runs again), or the test fails naming the stuck workers.
//!
//! 40 seconds of faults per backend by default (about a minute in all, with start-up, the
//! progress check and the drain); `ZKLOCK_SOAK_SECS=600` soaks longer, `ZKLOCK_SOAK_SEED=<n>`
//! replays a fault schedule (the seed is printed).

use crate::common;
use crate::faults;

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::say;
use faults::{leader_worker, mutex_worker, rw_worker, Crew, Work};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;
use zklock::{Error, LockManager, Ran};
use zklock_testkit::{
    now_ns, EtcdServer, History, MariaDbServer, Mode, Op, PostgresServer, Recorder, RedisServer,
};

/// Seconds of faults per backend, unless `ZKLOCK_SOAK_SECS` says otherwise.
const DEFAULT_SECS: u64 = 40;
/// The three managers: (lease ms, linger ms, local queue).
const MIX: [(u64, u64, bool); 3] = [(1_000, 0, true), (3_000, 300, false), (10_000, 300, true)];
const MUTEX_KEYS: [&str; 2] = ["soak-a", "soak-b"];
const RW_KEY: &str = "soak-rw";
const JOB_KEY: &str = "soak-job";
const ELECTION: &str = "soak-leader";
/// The job's `at_least` window.
const JOB_WINDOW: Duration = Duration::from_secs(2);
/// Once the faults are over, every worker is granted again within this long. It covers the
/// longest lease (a hold whose holder saw the server go away runs out on the server) and a
/// turn of every worker queued on a key.
const PROGRESS_BOUND: Duration = Duration::from_secs(30);
/// The class (first key) of zklock's advisory locks on PostgreSQL, as `pg_locks.classid` shows it.
const PG_LOCK_CLASS: i64 = 0x7A6B_4C4B;

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The server under test.
enum Server {
    /// With whether it keeps its data across a restart ([`RedisServer::start_durable`]).
    Redis(RedisServer, bool),
    Postgres(PostgresServer),
    Etcd(EtcdServer),
    MySql(MariaDbServer),
}

impl Server {
    fn name(&self) -> &'static str {
        match self {
            Server::Redis(_, true) => "redis (durable)",
            Server::Redis(_, false) => "redis",
            Server::Postgres(_) => "postgres",
            Server::Etcd(_) => "etcd",
            Server::MySql(_) => "mysql",
        }
    }

    fn url(&self) -> String {
        match self {
            Server::Redis(s, _) => s.url(),
            Server::Postgres(s) => s.url(),
            Server::Etcd(s) => s.url(),
            Server::MySql(s) => s.url(),
        }
    }

    fn pause(&self) {
        match self {
            Server::Redis(s, _) => s.pause(),
            Server::Postgres(s) => s.pause(),
            Server::Etcd(s) => s.pause(),
            Server::MySql(s) => s.pause(),
        }
        .expect("pause the server")
    }

    fn resume(&self) {
        match self {
            Server::Redis(s, _) => s.resume(),
            Server::Postgres(s) => s.resume(),
            Server::Etcd(s) => s.resume(),
            Server::MySql(s) => s.resume(),
        }
        .expect("resume the server")
    }

    fn restart(&mut self) {
        match self {
            Server::Redis(s, _) => s.restart(),
            Server::Postgres(s) => s.restart(),
            Server::Etcd(s) => s.restart(),
            Server::MySql(s) => s.restart(),
        }
        .expect("restart the server")
    }
}

/// What the driver knows of the traffic: which workers take which history key, and the lock
/// path of each history key.
struct Traffic {
    workers_of: HashMap<String, Vec<String>>,
    key_of_path: HashMap<String, String>,
}

impl Traffic {
    /// Marks the fault `what` as silent for every worker of `history_key`.
    fn silent(&self, history: &History, history_key: &str, what: &str) {
        for w in &self.workers_of[history_key] {
            history.silent_fault(w, what);
        }
    }
}

/// Runs the job again and again until the crew stops: each run's body records the grant (with
/// the body's fencing token) and the run with its window, holds for a few ms, and records the
/// release; the body is stopped by the job when its hold is lost, which is recorded as the loss.
/// (The job gives no hook between its lock's grant and its body, so the recorded hold starts
/// with the body: inside the real one, when the worker begins to act under it.)
async fn job_worker(m: LockManager, rec: Recorder, crew: Crew) {
    const NOT_STARTED: u8 = 0;
    const RUNNING: u8 = 1;
    const DONE: u8 = 2;
    let job = m
        .job(JOB_KEY)
        .expect("a valid job name")
        .at_least(JOB_WINDOW);
    while !crew.stopped() {
        rec.acquire_invoked(JOB_KEY, Mode::Exclusive);
        let state = Arc::new(AtomicU8::new(NOT_STARTED));
        let hold = Duration::from_millis(rand::thread_rng().gen_range(0..=40));
        let body = {
            let (rec, state, crew) = (rec.clone(), state.clone(), crew.clone());
            async move {
                let token = zklock::current_fencing_token().expect("a job's body runs in a frame");
                rec.acquire_ok(JOB_KEY, Mode::Exclusive, token.as_u128());
                rec.job_ran(JOB_KEY, JOB_WINDOW);
                state.store(RUNNING, Ordering::SeqCst);
                crew.grants.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                rec.release_invoked(JOB_KEY);
                state.store(DONE, Ordering::SeqCst);
            }
        };
        let outcome = job.run(body).await;
        match (outcome, state.load(Ordering::SeqCst)) {
            (Ok(Ran::Ran(())), _) => rec.release_ok(JOB_KEY),
            (Ok(Ran::Skipped), _) => rec.acquire_failed(JOB_KEY, Mode::Exclusive, "skipped"),
            (Err(e), NOT_STARTED) => {
                rec.acquire_failed(JOB_KEY, Mode::Exclusive, e);
                crew.failures.fetch_add(1, Ordering::SeqCst);
            }
            // The body was stopped under a lost hold.
            (Err(e), RUNNING) => {
                rec.lost(JOB_KEY, e);
                crew.losses.fetch_add(1, Ordering::SeqCst);
            }
            (Err(e), _) => rec.release_failed(JOB_KEY, e),
        }
        let pause = rand::thread_rng().gen_range(50..250);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// Deals one Redis fault of kind `kind`; returns its name for the report.
async fn redis_fault(
    kind: usize,
    server: &mut Server,
    traffic: &Traffic,
    history: &History,
    rng: &mut StdRng,
) -> &'static str {
    let url = server.url();
    let conn = || async {
        redis::Client::open(url.as_str())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
            .await
            .expect("connect to the test Redis")
    };
    match kind {
        0 => {
            // The key of a holder, deleted behind its back: look for a held one for a while.
            let mut conn = conn().await;
            let mut paths: Vec<&String> = traffic.key_of_path.keys().collect();
            paths.sort();
            for _ in 0..100 {
                let path = paths[rng.gen_range(0..paths.len())];
                let name = format!("zklock:lock:{path}");
                let holder: Option<String> = redis::cmd("GET")
                    .arg(&name)
                    .query_async(&mut conn)
                    .await
                    .unwrap();
                if let Some(holder) = holder {
                    let what = format!("DEL {name}");
                    history.fault(&what);
                    traffic.silent(history, &traffic.key_of_path[path], &what);
                    let deleted: i64 = redis::Script::new(
                        "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                         return redis.call('DEL', KEYS[1]) else return 0 end",
                    )
                    .key(&name)
                    .arg(&holder)
                    .invoke_async(&mut conn)
                    .await
                    .unwrap();
                    if deleted == 1 {
                        return "DEL a holder's key";
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            "DEL (nothing held)"
        }
        1 | 2 => {
            let kind = if kind == 1 { "normal" } else { "pubsub" };
            history.fault(&format!("CLIENT KILL TYPE {kind}"));
            let _: i64 = redis::cmd("CLIENT")
                .arg("KILL")
                .arg("TYPE")
                .arg(kind)
                .query_async(&mut conn().await)
                .await
                .unwrap();
            if kind == "normal" {
                "CLIENT KILL TYPE normal"
            } else {
                "CLIENT KILL TYPE pubsub"
            }
        }
        3 => {
            let what = if matches!(server, Server::Redis(_, true)) {
                "restart (data kept: AOF, fsync always)"
            } else {
                "restart without persistence (data lost)"
            };
            history.fault(&format!("redis {what}"));
            blocking(|| server.restart());
            what
        }
        _ => pause(server, history, rng).await,
    }
}

/// Deals one PostgreSQL fault of kind `kind`; returns its name for the report.
async fn postgres_fault(
    kind: usize,
    server: &mut Server,
    traffic: &Traffic,
    history: &History,
    rng: &mut StdRng,
) -> &'static str {
    match kind {
        0 => {
            // A holding session, ended by the server: every hold on it is lost at once.
            let client = common::pg_client(&server.url()).await;
            for _ in 0..100 {
                let rows = client
                    .query(
                        "SELECT l.pid, k.path FROM pg_locks l \
                         JOIN zklock_keys k ON l.objid::bigint = k.id \
                         WHERE l.locktype = 'advisory' AND l.objsubid = 2 AND l.granted \
                         AND l.classid::bigint = $1",
                        &[&PG_LOCK_CLASS],
                    )
                    .await
                    .expect("query pg_locks");
                let held: Vec<(i32, String)> = rows
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .filter(|(_, path)| traffic.key_of_path.contains_key(path))
                    .collect();
                if !held.is_empty() {
                    let pid = held[rng.gen_range(0..held.len())].0;
                    let what = format!("pg_terminate_backend({pid})");
                    history.fault(&what);
                    for (_, path) in held.iter().filter(|(p, _)| *p == pid) {
                        traffic.silent(history, &traffic.key_of_path[path], &what);
                    }
                    // The session may carry any hold of its manager, granted since the look at
                    // `pg_locks` or in its last moments (a statement the server answers while
                    // the session is being ended): until the connection hears of the end, each
                    // is a hold taken away without a word, like the ones seen.
                    let owner: Option<String> = client
                        .query_opt(
                            "SELECT application_name FROM pg_stat_activity WHERE pid = $1",
                            &[&pid],
                        )
                        .await
                        .expect("query pg_stat_activity")
                        .map(|r| r.get(0));
                    if let Some(manager) = owner
                        .as_deref()
                        .and_then(|name| name.rsplit_once(" id="))
                        .map(|(_, id)| format!("{id}-"))
                    {
                        for worker in traffic.workers_of.values().flatten() {
                            if worker.starts_with(&manager) {
                                history.silent_fault(worker, &what);
                            }
                        }
                    }
                    let ended: bool = client
                        .query_one("SELECT pg_terminate_backend($1)", &[&pid])
                        .await
                        .expect("pg_terminate_backend")
                        .get(0);
                    if ended {
                        return "pg_terminate_backend of a holder";
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            "pg_terminate_backend (nothing held)"
        }
        1 => {
            history.fault("postgres restarted");
            blocking(|| server.restart());
            "restart"
        }
        _ => pause(server, history, rng).await,
    }
}

/// Deals one MySQL fault of kind `kind`; returns its name for the report.
async fn mysql_fault(
    kind: usize,
    server: &mut Server,
    traffic: &Traffic,
    history: &History,
    rng: &mut StdRng,
) -> &'static str {
    use mysql_async::prelude::Queryable;
    let Server::MySql(db) = &*server else {
        unreachable!("a MySQL soak")
    };
    match kind {
        0 => {
            // A holding session, ended from outside (`KILL`): its hold is lost at once. The
            // kill goes out on a session of the test's own, so that it lands within a
            // millisecond of the marks around it.
            let sql = |q: &str| blocking(|| db.root_sql(q)).expect("run SQL on MariaDB");
            // Over TCP, as the same account as the holders' sessions (`zklock`@`127.0.0.1`:
            // an account may end only its own sessions).
            let opts = mysql_async::Opts::from_url(&db.url()).expect("the test MariaDB's URL");
            let opts = mysql_async::OptsBuilder::from_opts(opts).prefer_socket(false);
            let mut admin = mysql_async::Conn::new(opts)
                .await
                .expect("connect to the test MariaDB");
            for _ in 0..100 {
                // Each held lock's session, and the manager that wrote the lock's row at its
                // grant (the holder's: a session belongs to one manager's pool).
                let held: Vec<(String, String, String)> = sql(
                    "SELECT IS_USED_LOCK(name), path, holder FROM zklock.zklock_locks \
                     WHERE IS_USED_LOCK(name) IS NOT NULL",
                )
                .lines()
                .filter_map(|l| {
                    let mut f = l.split('\t');
                    Some((f.next()?.into(), f.next()?.into(), f.next()?.into()))
                })
                .filter(|(_, path, _)| traffic.key_of_path.contains_key(path))
                .collect();
                if !held.is_empty() {
                    let (session, path, holder) = &held[rng.gen_range(0..held.len())];
                    let what = format!("KILL {session}");
                    history.fault(&what);
                    // The session may have moved on to another hold of its manager since the
                    // look: each is a hold taken away without a word, like the one seen. The
                    // kill lands at some moment between the marks before and after it.
                    let hit = || {
                        traffic.silent(history, &traffic.key_of_path[path], &what);
                        if let Some((_, id)) = holder.rsplit_once(" id=") {
                            let manager = format!("{id}-");
                            for worker in traffic.workers_of.values().flatten() {
                                if worker.starts_with(&manager) {
                                    history.silent_fault(worker, &what);
                                }
                            }
                        }
                    };
                    hit();
                    let killed = admin.query_drop(format!("KILL {session}")).await;
                    hit();
                    if killed.is_ok() {
                        return "KILL of a holding session";
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            "KILL (nothing held)"
        }
        1 => {
            history.fault("mysql restarted");
            blocking(|| server.restart());
            "restart"
        }
        _ => pause(server, history, rng).await,
    }
}

/// Deals one etcd fault of kind `kind`; returns its name for the report.
async fn etcd_fault(
    kind: usize,
    server: &mut Server,
    traffic: &Traffic,
    history: &History,
    rng: &mut StdRng,
) -> &'static str {
    let Server::Etcd(etcd) = &*server else {
        unreachable!("an etcd soak")
    };
    match kind {
        0 | 1 => {
            // A holder's key deleted, or its lease revoked, behind its back: look for a held
            // lock for a while (the first key under a lock's path holds it).
            let mut client = etcd_client::Client::connect([etcd.client_url()], None)
                .await
                .expect("connect to the test etcd");
            let mut paths: Vec<&String> = traffic.key_of_path.keys().collect();
            paths.sort();
            for _ in 0..100 {
                let path = paths[rng.gen_range(0..paths.len())];
                let first = client
                    .get(
                        format!("{path}/"),
                        Some(
                            etcd_client::GetOptions::new()
                                .with_prefix()
                                .with_sort(
                                    etcd_client::SortTarget::Create,
                                    etcd_client::SortOrder::Ascend,
                                )
                                .with_limit(1),
                        ),
                    )
                    .await
                    .expect("read the test etcd");
                let Some(kv) = first.kvs().first() else {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                };
                let key = String::from_utf8_lossy(kv.key()).into_owned();
                if kind == 0 {
                    let what = format!("etcdctl del {key}");
                    history.fault(&what);
                    traffic.silent(history, &traffic.key_of_path[path], &what);
                    client
                        .delete(key, None)
                        .await
                        .expect("delete a holder's key");
                    return "del a holder's key";
                }
                // Every hold of the lease's manager goes with it (its keys name it: id=m<i>).
                let lease = kv.lease();
                let what = format!("etcdctl lease revoke {lease:x}");
                history.fault(&what);
                let value = String::from_utf8_lossy(kv.value()).into_owned();
                if let Some(manager) = value.rsplit_once(" id=").map(|(_, id)| format!("{id}-")) {
                    for worker in traffic.workers_of.values().flatten() {
                        if worker.starts_with(&manager) {
                            history.silent_fault(worker, &what);
                        }
                    }
                } else {
                    // A latch's key holds its participant id (m<i>) instead.
                    let manager = format!("{value}-");
                    for worker in traffic.workers_of.values().flatten() {
                        if worker.starts_with(&manager) {
                            history.silent_fault(worker, &what);
                        }
                    }
                }
                let _ = client.lease_revoke(lease).await;
                return "lease revoke of a holder";
            }
            "del or revoke (nothing held)"
        }
        2 => {
            history.fault("etcd restarted");
            blocking(|| server.restart());
            "restart"
        }
        _ => pause(server, history, rng).await,
    }
}

/// Freezes the server past the shortest lease, then lets it run again.
async fn pause(server: &Server, history: &History, rng: &mut StdRng) -> &'static str {
    let long = Duration::from_millis(rng.gen_range(1_200..2_500));
    history.fault(&format!("server paused for {long:?}"));
    server.pause();
    tokio::time::sleep(long).await;
    server.resume();
    "pause"
}

/// The workers that have not been granted since `since_ns`: for a job worker, a decision
/// (a run, or a skip) counts, and the job must have run since as well.
fn not_granted_since(history: &History, since_ns: u64, workers: &[String]) -> Vec<String> {
    let mut granted: HashMap<&str, bool> = workers.iter().map(|w| (w.as_str(), false)).collect();
    let mut job_ran = false;
    let events = history.events();
    for e in events.iter().filter(|e| e.at_ns > since_ns) {
        let decided = match &e.op {
            Op::AcquireOk { .. } => true,
            Op::AcquireFailed { error } => e.key == JOB_KEY && error == "skipped",
            Op::JobRan { .. } => {
                job_ran = true;
                false
            }
            _ => false,
        };
        if decided {
            if let Some(g) = granted.get_mut(e.worker.as_str()) {
                *g = true;
            }
        }
    }
    let mut stuck: Vec<String> = granted
        .into_iter()
        .filter(|(_, g)| !g)
        .map(|(w, _)| w.to_string())
        .collect();
    if !job_ran {
        stuck.push(format!("the job {JOB_KEY} (no run)"));
    }
    stuck.sort();
    stuck
}

/// The last event of `worker`, for a message.
fn last_event_of(history: &History, worker: &str) -> String {
    history
        .events()
        .iter()
        .rev()
        .find(|e| e.worker == worker)
        .map_or("nothing".into(), |e| e.to_line())
}

/// The events of the keys of the first violations around them, to show with a failure.
fn excerpt(history: &History, report: &zklock_testkit::Report) -> String {
    let mut out = String::new();
    for v in report.violations.iter().take(3) {
        let (key, from, to) = match v {
            zklock_testkit::Violation::Overlap(o) => (
                o.first.key.clone(),
                o.first.invoked_ns,
                o.second.end_ns.unwrap_or(o.second.start_ns),
            ),
            zklock_testkit::Violation::TokenNotIncreasing { earlier, later } => (
                later.key.clone(),
                earlier.invoked_ns,
                later.end_ns.unwrap_or(later.start_ns),
            ),
            zklock_testkit::Violation::JobTooSoon { earlier, later } => {
                (later.key.clone(), earlier.at_ns, later.at_ns)
            }
            _ => continue,
        };
        out += &format!("  around: {v}\n");
        let margin = 500_000_000;
        for e in history.events().iter().filter(|e| {
            (e.key == key || e.key.is_empty()) && e.at_ns + margin >= from && e.at_ns <= to + margin
        }) {
            out += &format!("    {}\n", e.to_line());
        }
    }
    out
}

async fn soak(mut server: Server) {
    let began = Instant::now();
    let backend = server.name();
    let (secs, seed) = common::soak_settings(&format!("soak_backends {backend}"), DEFAULT_SECS);
    let mut rng = StdRng::seed_from_u64(seed);
    let managers = connect_managers(&server.url()).await;
    let leaders = has_leader_latch(&managers[0], backend).await;
    let rwlocks = has_rwlocks(&managers[0], backend).await;
    let key_of_path = key_of_path(&managers[0], leaders);
    let history = History::new();
    let crew = Crew::new();
    let workers = start_workers(&managers, &history, &crew, leaders, rwlocks);
    let traffic = Traffic {
        workers_of: workers.of_key,
        key_of_path,
    };

    // Faults, one after another, with traffic in between.
    let faults_began = Instant::now();
    let run = Duration::from_secs(secs);
    let injected = deal_faults(&mut server, &traffic, &history, &mut rng, run).await;
    let faults_took = faults_began.elapsed();

    let progress_began = Instant::now();
    let stuck = until_every_worker_granted(&history, &workers.names).await;
    let progress_took = progress_began.elapsed();
    stop(&crew, workers.tasks, &managers).await;

    let outcome = Outcome {
        backend,
        seed,
        began,
        faults_took,
        progress_took,
        leaders,
        injected,
        stuck,
    };
    let report = history.check();
    outcome.say_report(&history, &report);
    outcome.assert_ok(&history, &report);
}

/// The three managers of [`MIX`] on the server at `url`.
async fn connect_managers(url: &str) -> Vec<LockManager> {
    let mut managers = Vec::new();
    for (i, (lease_ms, linger_ms, local)) in MIX.into_iter().enumerate() {
        let lease = Duration::from_millis(lease_ms);
        let builder = LockManager::builder(url);
        let builder = match zklock::BackendKind::of(url).unwrap() {
            zklock::BackendKind::Postgres => builder.postgres(|pg| pg.lease(lease)),
            // MySQL counts wait_timeout in whole seconds.
            zklock::BackendKind::MySql => {
                builder.mysql(|my| my.lease(Duration::from_secs(lease.as_secs().max(1))))
            }
            // etcd counts its leases in whole seconds, 2 at least.
            zklock::BackendKind::Etcd => {
                builder.etcd(|e| e.lease(Duration::from_secs(lease.as_secs().max(2))))
            }
            _ => builder.redis(|r| r.lease(lease)),
        };
        managers.push(
            builder
                // Names the manager's sessions on PostgreSQL (`application_name`): a session
                // ended by the server is the fault of every worker of that manager.
                .identity(format!("m{i}"))
                .linger(Duration::from_millis(linger_ms))
                .local_queue(local)
                .connect()
                .await
                .expect("connect to the test server"),
        );
    }
    managers
}

/// Leadership, where the backend has it: whether a probe election can be led.
async fn has_leader_latch(m: &LockManager, backend: &str) -> bool {
    match m
        .leader_latch("soak-probe", "probe")
        .expect("a valid election name")
        .lead_timeout(Duration::from_secs(10))
        .await
    {
        Ok(leadership) => {
            leadership.leave().await.expect("leave the probe election");
            true
        }
        Err(e @ Error::Unsupported { .. }) => {
            say(&format!(
                "soak_backends {backend}: no leader workers, the backend has no leader latch: {e}"
            ));
            false
        }
        Err(e) => panic!("the probe election failed: {e}"),
    }
}

/// Read/write locks, where the backend has them (MySQL's user locks are exclusive).
async fn has_rwlocks(m: &LockManager, backend: &str) -> bool {
    match m.rwlock("soak-probe").unwrap().try_read().await {
        Ok(read) => {
            drop(read);
            true
        }
        Err(e @ Error::Unsupported { .. }) => {
            say(&format!(
                "soak_backends {backend}: no reader or writer workers, the backend has no \
                 read/write locks: {e}"
            ));
            false
        }
        Err(e) => panic!("the probe read lock failed: {e}"),
    }
}

/// The history key of each lock path of the traffic.
fn key_of_path(m0: &LockManager, leaders: bool) -> HashMap<String, String> {
    let mut key_of_path = HashMap::new();
    for key in MUTEX_KEYS.into_iter().chain([JOB_KEY]) {
        key_of_path.insert(m0.path_of(key).unwrap(), key.to_string());
    }
    key_of_path.insert(
        m0.rwlock(RW_KEY).unwrap().path().to_string(),
        format!("rw:{RW_KEY}"),
    );
    if leaders {
        key_of_path.insert(
            m0.leader_latch(ELECTION, "m0").unwrap().path().to_string(),
            format!("leader:{ELECTION}"),
        );
    }
    key_of_path
}

/// The workers of the soak.
struct Workers {
    /// The workers of each history key.
    of_key: HashMap<String, Vec<String>>,
    /// Every worker's name.
    names: Vec<String>,
    tasks: Vec<JoinHandle<()>>,
}

/// The workers of each manager: three mutex workers on two keys, two readers and writers, a
/// job worker, and a leader worker where the backend has leaders.
fn start_workers(
    managers: &[LockManager],
    history: &History,
    crew: &Crew,
    leaders: bool,
    rwlocks: bool,
) -> Workers {
    let work = Work {
        wait: Duration::from_secs(10),
        hold: Duration::from_millis(20),
        think: Duration::from_millis(10),
    };
    let mut workers_of: HashMap<String, Vec<String>> = HashMap::new();
    let mut workers = Vec::new();
    let mut tasks: Vec<JoinHandle<()>> = Vec::new();
    for (i, m) in managers.iter().enumerate() {
        let mut add = |name: String, key: &str| -> Recorder {
            workers_of
                .entry(key.to_string())
                .or_default()
                .push(name.clone());
            workers.push(name.clone());
            history.recorder(&name)
        };
        for (j, key) in [MUTEX_KEYS[0], MUTEX_KEYS[0], MUTEX_KEYS[1]]
            .into_iter()
            .enumerate()
        {
            let rec = add(format!("m{i}-mutex{j}"), key);
            tasks.push(tokio::spawn(mutex_worker(
                m.clone(),
                key.to_string(),
                rec,
                crew.clone(),
                work,
            )));
        }
        for j in 0..if rwlocks { 2 } else { 0 } {
            let rec = add(format!("m{i}-rw{j}"), &format!("rw:{RW_KEY}"));
            tasks.push(tokio::spawn(rw_worker(
                m.clone(),
                RW_KEY.to_string(),
                rec,
                crew.clone(),
                work,
                3,
            )));
        }
        let rec = add(format!("m{i}-job"), JOB_KEY);
        tasks.push(tokio::spawn(job_worker(m.clone(), rec, crew.clone())));
        if leaders {
            let rec = add(format!("m{i}-leader"), &format!("leader:{ELECTION}"));
            tasks.push(tokio::spawn(leader_worker(
                m.clone(),
                ELECTION.to_string(),
                format!("m{i}"),
                rec,
                crew.clone(),
                work,
            )));
        }
    }
    Workers {
        of_key: workers_of,
        names: workers,
        tasks,
    }
}

/// Deals faults at random for `run`, with traffic in between; answers how many of each.
async fn deal_faults(
    server: &mut Server,
    traffic: &Traffic,
    history: &History,
    rng: &mut StdRng,
    run: Duration,
) -> BTreeMap<&'static str, u64> {
    let mut injected: BTreeMap<&str, u64> = BTreeMap::new();
    let faults_began = Instant::now();
    while faults_began.elapsed() < run {
        let between = Duration::from_millis(rng.gen_range(300..1_500));
        tokio::time::sleep(between).await;
        let what = match server {
            Server::Redis(..) => {
                let kind = rng.gen_range(0..5);
                redis_fault(kind, server, traffic, history, rng).await
            }
            Server::Postgres(_) => {
                let kind = rng.gen_range(0..3);
                postgres_fault(kind, server, traffic, history, rng).await
            }
            Server::Etcd(_) => {
                let kind = rng.gen_range(0..4);
                etcd_fault(kind, server, traffic, history, rng).await
            }
            Server::MySql(_) => {
                let kind = rng.gen_range(0..3);
                mysql_fault(kind, server, traffic, history, rng).await
            }
        };
        *injected.entry(what).or_default() += 1;
    }
    injected
}

/// Progress: every worker is granted again once the faults are over. Answers the workers that
/// were not within [`PROGRESS_BOUND`].
async fn until_every_worker_granted(history: &History, workers: &[String]) -> Vec<String> {
    let last_fault_ns = now_ns();
    let progress_began = Instant::now();
    loop {
        let stuck = not_granted_since(history, last_fault_ns, workers);
        if stuck.is_empty() || progress_began.elapsed() > PROGRESS_BOUND {
            return stuck;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Stops the workers and waits for the managers' background releases.
async fn stop(crew: &Crew, tasks: Vec<JoinHandle<()>>, managers: &[LockManager]) {
    crew.stop();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("workers stop")
            .expect("a worker panicked");
    }
    for m in managers {
        tokio::time::timeout(Duration::from_secs(60), m.flush())
            .await
            .expect("background releases finish");
    }
}

/// What one backend's soak did, for its report and its checks.
struct Outcome {
    backend: &'static str,
    seed: u64,
    began: Instant,
    faults_took: Duration,
    /// How long after the last fault every worker was granted again.
    progress_took: Duration,
    leaders: bool,
    injected: BTreeMap<&'static str, u64>,
    /// The workers not granted again within [`PROGRESS_BOUND`].
    stuck: Vec<String>,
}

impl Outcome {
    /// The report, printed even when the test passes; on a violation, the whole history
    /// written to a file, and the events around the first violations.
    fn say_report(&self, history: &History, report: &zklock_testkit::Report) {
        let (backend, seed, injected) = (self.backend, self.seed, &self.injected);
        let faults: u64 = injected.values().sum();
        say(&format!(
            "soak_backends {backend} report: seed {seed}, {:.1} s of faults, {:.1} s in all: \
             operations {} (acquires {}, failed acquires {}, releases {}, losses reported {}, job runs \
             {}), faults {faults} {injected:?}, violations {}, unprotected windows {}, leader workers \
             {}, every worker granted again {:.1} s after the last fault",
            self.faults_took.as_secs_f64(),
            self.began.elapsed().as_secs_f64(),
            report.acquires_invoked + report.releases,
            report.acquires,
            report.acquire_failures,
            report.releases,
            report.losses,
            report.job_runs,
            report.violations.len(),
            report.unprotected.len(),
            if self.leaders {
                "on"
            } else {
                "skipped (unsupported)"
            },
            self.progress_took.as_secs_f64(),
        ));
        for overlap in report.unprotected.iter().take(10) {
            say(&format!(
                "soak_backends {backend}: unprotected window: {overlap}"
            ));
        }
        if !report.is_ok() {
            let file = std::env::temp_dir().join(format!("zklock-soak-{backend}-{seed}.history"));
            let lines: String = history
                .events()
                .iter()
                .map(|e| e.to_line() + "\n")
                .collect();
            let _ = std::fs::write(&file, lines);
            say(&format!(
                "soak_backends {backend}: the history is in {}; around the first violations:\n{}",
                file.display(),
                excerpt(history, report)
            ));
        }
    }

    /// No violation, every worker granted again after the faults, faults and traffic enough,
    /// and the job ran.
    fn assert_ok(&self, history: &History, report: &zklock_testkit::Report) {
        let (backend, seed, stuck) = (self.backend, self.seed, &self.stuck);
        let faults: u64 = self.injected.values().sum();
        report.assert_ok();
        assert!(
            stuck.is_empty(),
            "no progress on {backend} (seed {seed}): not granted within {PROGRESS_BOUND:?} of the \
             last fault: {}",
            stuck
                .iter()
                .map(|w| format!("{w} (last: {})", last_event_of(history, w)))
                .collect::<Vec<_>>()
                .join("; ")
        );
        assert!(faults > 0, "no fault was dealt");
        assert!(
            report.acquires > 100,
            "too little traffic: {}",
            report.summary()
        );
        assert!(
            report.job_runs > 0,
            "the job never ran: {}",
            report.summary()
        );
    }
}

/// Redis with an append-only file fsynced at every write, as a deployment that needs its job
/// windows kept configures it: a restart keeps the data (the holders still see their
/// connections break, and lose their holds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_redis_random_faults_under_mixed_traffic() {
    let server = blocking(RedisServer::start_durable).expect("start redis-server (test kit)");
    soak(Server::Redis(server, true)).await;
}

/// Redis without persistence: a restart empties it. Locks keep every promise (their holders see
/// the connections break and lose their holds; tokens are floored by the server's clock), but a
/// job's `at_least` window is kept only in the server's memory: the first claim after the restart
/// finds no record and runs, inside the window of the run before the restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "fails: a Redis restart without persistence loses the job's at_least record \
            (zklock:run:<path>), and the next claim runs at once, inside the earlier run's window \
            (Violation::JobTooSoon after restarts; seed 10011114756742596226 found 6, one per \
            restart); no fix yet: see the Redis backend's claim_run"]
async fn soak_redis_restarts_without_persistence() {
    let server = blocking(RedisServer::start).expect("start redis-server (test kit)");
    soak(Server::Redis(server, false)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_postgres_random_faults_under_mixed_traffic() {
    let server = blocking(PostgresServer::start).expect("start postgres (test kit)");
    soak(Server::Postgres(server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_etcd_random_faults_under_mixed_traffic() {
    let server = blocking(EtcdServer::start).expect("start etcd (test kit)");
    soak(Server::Etcd(server)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_mysql_random_faults_under_mixed_traffic() {
    let server = blocking(MariaDbServer::start).expect("start MariaDB (test kit)");
    soak(Server::MySql(server)).await;
}
