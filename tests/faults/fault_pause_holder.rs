//! Fault: the holder's process frozen with SIGSTOP past its session timeout, then resumed — the
//! case no lock service can prevent (Jepsen's and Kleppmann's point), only fencing can.
//!
//! Worker processes (this test binary, run again as `pause_worker_process`) lock a key, read a
//! shared counter from a store, and write it back incremented. The first worker is frozen right
//! after its read; its session expires; the second worker takes the lock (with a larger fencing
//! token), increments and leaves; then the first resumes and writes what it computed before the
//! pause:
//!
//! - unfenced, the write goes through: an increment is lost, as Jepsen expects of any lock;
//! - fenced by the token (the store refuses a write older than the last it accepted), or by a
//!   ZooKeeper `multi` that checks the writer's lock node still exists, the write is refused and
//!   no update is lost.
//!
//! The history checker sees the overlap in every variant and classifies it as the unprotected
//! window a silent fault (the SIGSTOP) opens; tokens increase; nothing is left behind.

use crate::common;
use crate::faults;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use faults::*;
use zklock::{zookeeper_client, LockManager};
use zklock_testkit::{History, Mode, Recorder, Report};

/// The environment variable that makes `pause_worker_process` a worker (its value: the variant).
const WORKER: &str = "ZKLOCK_PAUSE_WORKER";

/// The store's record: `"<value> <token of the last accepted write>"`.
fn decode(data: &[u8]) -> (u64, u128) {
    let text = String::from_utf8_lossy(data);
    let mut parts = text.split_whitespace();
    let value = parts.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let token = parts.next().and_then(|t| t.parse().ok()).unwrap_or(0);
    (value, token)
}

fn encode(value: u64, token: u128) -> Vec<u8> {
    format!("{value} {token}").into_bytes()
}

/// Writes `value` to the store as a holder with `token` and `lock_node` would, per `variant`.
/// `Ok` when the store took it.
async fn write(
    store: &zookeeper_client::Client,
    path: &str,
    variant: &str,
    value: u64,
    token: u128,
    lock_node: &str,
) -> Result<(), String> {
    match variant {
        "unfenced" => store
            .set_data(path, &encode(value, token), None)
            .await
            .map(drop)
            .map_err(|e| e.to_string()),
        // The store refuses a write whose token is older than the last it accepted (a
        // compare-and-set on the record's version keeps the check and the write atomic).
        "token" => loop {
            let (data, stat) = store.get_data(path).await.map_err(|e| e.to_string())?;
            let (_, last) = decode(&data);
            if token < last {
                return Err(format!("refused: token {token} is older than {last}"));
            }
            match store
                .set_data(path, &encode(value, token), Some(stat.version))
                .await
            {
                Ok(_) => return Ok(()),
                Err(zookeeper_client::Error::BadVersion) => continue,
                Err(e) => return Err(e.to_string()),
            }
        },
        // ZooKeeper as the store: the write happens only if the lock node still exists.
        "multi" => {
            let mut multi = store.new_multi_writer();
            multi
                .add_check_version(lock_node, -1)
                .map_err(|e| e.to_string())?;
            multi
                .add_set_data(path, &encode(value, token), None)
                .map_err(|e| e.to_string())?;
            multi
                .commit()
                .await
                .map(drop)
                .map_err(|e| format!("refused: {e}"))
        }
        other => panic!("unknown variant {other}"),
    }
}

/// The worker test's name as libtest knows it: its module path below the crate
/// (`fault_pause_holder::pause_worker_process` in the `faults` binary).
fn worker_test_name() -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::pause_worker_process"),
        None => "pause_worker_process".to_string(),
    }
}

/// A worker process: lock, read, (be frozen), write, release — recording its history to a file.
#[test]
#[ignore = "a worker process that fault_pause_holder's scenario starts itself"]
fn pause_worker_process() {
    let Ok(variant) = std::env::var(WORKER) else {
        return; // run by hand with --ignored: nothing to do
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let (connect, key, name, dir) = (
        var("ZKLOCK_CONNECT"),
        var("ZKLOCK_KEY"),
        var("ZKLOCK_WORKER_NAME"),
        PathBuf::from(var("ZKLOCK_WORKER_DIR")),
    );
    let pause = std::env::var("ZKLOCK_WORKER_PAUSE").is_ok();
    let store_path = var("ZKLOCK_STORE");
    let rec = Recorder::to_file(&dir.join(format!("{name}.history")), &name).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let m = LockManager::builder(&connect)
            .zookeeper(|zk| zk.session_timeout(Duration::from_secs(1)))
            .connect()
            .await
            .unwrap();
        // The store's own session outlives the pause: it is the database, not the lock.
        let store = zookeeper_client::Client::connector()
            .with_session_timeout(Duration::from_secs(30))
            .connect(&connect)
            .await
            .unwrap();
        // `leader-<fence>`: the holder is a leader (Curator's LeaderLatch) fenced by its epoch.
        let (fence, leader) = match variant.strip_prefix("leader-") {
            Some(fence) => (fence.to_string(), true),
            None => (variant.clone(), false),
        };
        rec.acquire_invoked(&key, Mode::Exclusive);
        let held = if leader {
            Held::Leader(m.leader_latch(&key, &name).unwrap().lead().await.unwrap())
        } else {
            Held::Lock(m.lock(&key).await.unwrap())
        };
        let token = held.token();
        rec.acquire_ok(&key, Mode::Exclusive, token);
        let (value, _) = decode(&store.get_data(&store_path).await.unwrap().0);
        if pause {
            // Frozen here by the test; the go file appears only after the other worker is done.
            fs::write(dir.join(format!("{name}.read")), b"").unwrap();
            let deadline = Instant::now() + Duration::from_secs(60);
            while !dir.join("go").exists() {
                assert!(Instant::now() < deadline, "never told to go on");
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        let outcome = write(
            &store,
            &store_path,
            &fence,
            value + 1,
            token,
            held.node_path(),
        )
        .await;
        fs::write(
            dir.join(format!("{name}.outcome")),
            match &outcome {
                Ok(()) => "ok".to_string(),
                Err(e) => e.clone(),
            },
        )
        .unwrap();
        rec.release_invoked(&key);
        match held.release().await {
            Ok(()) => rec.release_ok(&key),
            Err(e) => rec.release_failed(&key, e),
        }
        m.flush().await;
    });
}

/// What a worker holds: a lock, or the leadership of an election.
enum Held {
    Lock(zklock::LockGuard),
    Leader(zklock::Leadership),
}

impl Held {
    fn token(&self) -> u128 {
        match self {
            Held::Lock(guard) => guard.fencing_token().as_u128(),
            Held::Leader(leadership) => leadership.epoch().as_u128(),
        }
    }

    /// The lock node, for the `multi` fence (locks only).
    fn node_path(&self) -> &str {
        match self {
            Held::Lock(guard) => guard.node_path(),
            Held::Leader(_) => "",
        }
    }

    async fn release(self) -> zklock::Result<()> {
        match self {
            Held::Lock(guard) => guard.release().await,
            Held::Leader(leadership) => leadership.leave().await,
        }
    }
}

/// A worker process, killed if still running when dropped.
struct Worker {
    child: Child,
    name: String,
}

impl Worker {
    fn start(
        connect: &str,
        key: &str,
        store: &str,
        variant: &str,
        name: &str,
        dir: &Path,
        pause: bool,
    ) -> Worker {
        let mut cmd = Command::new(std::env::current_exe().unwrap());
        cmd.args([
            worker_test_name().as_str(),
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(WORKER, variant)
        .env("ZKLOCK_CONNECT", connect)
        .env("ZKLOCK_KEY", key)
        .env("ZKLOCK_STORE", store)
        .env("ZKLOCK_WORKER_NAME", name)
        .env("ZKLOCK_WORKER_DIR", dir)
        .stdin(Stdio::null())
        .stdout(fs::File::create(dir.join(format!("{name}.log"))).unwrap())
        .stderr(fs::File::create(dir.join(format!("{name}.err"))).unwrap());
        if pause {
            cmd.env("ZKLOCK_WORKER_PAUSE", "1");
        }
        Worker {
            child: cmd.spawn().unwrap(),
            name: name.to_string(),
        }
    }

    fn signal(&self, sig: &str) {
        faults::signal(self.child.id(), sig);
    }

    /// SIGSTOP, and wait until every thread of the process has stopped.
    fn freeze(&self) {
        faults::freeze(self.child.id(), &self.name);
    }

    /// Waits (bounded) for the worker to exit successfully.
    async fn finish(&mut self, dir: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let err =
                    fs::read_to_string(dir.join(format!("{}.err", self.name))).unwrap_or_default();
                assert!(status.success(), "{} failed ({status}):\n{err}", self.name);
                return;
            }
            assert!(Instant::now() < deadline, "{} did not finish", self.name);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Outcome {
    report: Report,
    value: u64,
    first: String,
    second: String,
}

/// One run: the first worker frozen after its read, the second working meanwhile.
async fn run(zk: &ZkServer, variant: &str) -> Outcome {
    let connect = zk.connect_string();
    let dir = tempfile::tempdir().unwrap();
    let key = format!("pause_{variant}");
    let store = format!("/store_{variant}");
    let admin = manager(&connect).await;
    admin
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager")
        .create(
            &store,
            &encode(0, 0),
            &zookeeper_client::CreateMode::Persistent
                .with_acls(zookeeper_client::Acls::anyone_all()),
        )
        .await
        .unwrap();
    let history = History::new();

    let mut first = Worker::start(&connect, &key, &store, variant, "first", dir.path(), true);
    eventually(
        "the first worker to hold and read",
        Duration::from_secs(30),
        || async { dir.path().join("first.read").exists() },
    )
    .await;
    first.freeze();
    history.silent_fault("first", "SIGSTOP past the session timeout");
    let mut second = Worker::start(&connect, &key, &store, variant, "second", dir.path(), false);
    second.finish(dir.path()).await;
    fs::write(dir.path().join("go"), b"").unwrap();
    first.signal("-CONT");
    first.finish(dir.path()).await;

    for name in ["first", "second"] {
        history
            .load(&dir.path().join(format!("{name}.history")))
            .unwrap();
    }
    let report = history.check();
    let (value, _) = decode(
        &admin
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .get_data(&store)
            .await
            .unwrap()
            .0,
    );
    let read = |name: &str| fs::read_to_string(dir.path().join(format!("{name}.outcome"))).unwrap();
    let outcome = Outcome {
        report,
        value,
        first: read("first"),
        second: read("second"),
    };
    eprintln!(
        "fault_pause_holder [{variant}]: counter {} after 2 increments; first writer: {}; second: {}; {}",
        outcome.value,
        outcome.first,
        outcome.second,
        outcome.report.summary()
    );
    assert_no_contenders(
        &admin
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        &admin.path_of(&key).unwrap(),
        Duration::from_secs(10),
    )
    .await;
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_holder_overlaps_the_next_one_and_only_fencing_saves_the_shared_state() {
    let zk = server();
    for variant in [
        "unfenced",
        "token",
        "multi",
        "leader-unfenced",
        "leader-token",
    ] {
        let o = run(&zk, variant).await;
        // The lock behaved: the overlap is the window the SIGSTOP opened, tokens increased.
        o.report.assert_ok();
        assert_eq!(o.report.unprotected.len(), 1, "{}", o.report);
        let overlap = &o.report.unprotected[0];
        assert_eq!(overlap.first.worker, "first");
        assert_eq!(overlap.second.worker, "second");
        assert!(overlap.second.token > overlap.first.token);
        assert_eq!(o.second, "ok");
        if variant.ends_with("unfenced") {
            // Both increments were acknowledged, and one of them is lost.
            assert_eq!(o.first, "ok", "the unfenced write goes through");
            assert_eq!(o.value, 1, "a lost update, as Jepsen expects of any lock");
        } else {
            assert!(o.first.starts_with("refused"), "{variant}: {}", o.first);
            assert_eq!(
                o.value, 1,
                "{variant}: the one acknowledged increment, none lost"
            );
        }
    }
    let admin = manager(&zk.connect_string()).await;
    assert_no_contenders(
        &admin
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager"),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
    assert_no_watches(
        || zk.four_letter("wchp").into_iter().collect(),
        ROOT,
        Duration::from_secs(10),
    )
    .await;
}
