//! 4. The holder's process frozen (SIGSTOP) past its lease, then resumed: fenced off and told.

use super::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use zklock::fence::{EtcdFence, EtcdWrite, Outcome};

/// The environment variable that makes `etcd_pause_worker_process` the frozen holder.
const WORKER: &str = "ZKLOCK_ETCD_PAUSE_WORKER";
/// The etcd key the holders write through the fence.
const STORE: &str = "shop/stock/sku_7";

/// The frozen holder's process: lock, note the token, (be frozen), write through the fence
/// with that token, report the loss, release — recording its history to a file.
#[test]
#[ignore = "a worker process that the SIGSTOP scenario of fault_etcd starts itself"]
fn etcd_pause_worker_process() {
    let Ok(url) = std::env::var(WORKER) else {
        return; // run by hand with --ignored: nothing to do
    };
    let var = |name: &str| std::env::var(name).unwrap_or_else(|_| panic!("{name} is set"));
    let (key, dir) = (var("ZKLOCK_KEY"), PathBuf::from(var("ZKLOCK_WORKER_DIR")));
    let rec = Recorder::to_file(&dir.join("first.history"), "first").unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let m = etcd_manager(&url, SHORT).await;
        let fence = EtcdFence::new(
            m.client::<zklock::etcd_client::Client>()
                .expect("an etcd manager's client"),
        );
        let guard = hold(&m, &key, &rec).await;
        let token = guard.fencing_token();
        let wrote = guard
            .fenced(&fence)
            .write(EtcdWrite::new().put(STORE, format!("first {token}")))
            .await
            .unwrap();
        assert!(wrote.is_accepted(), "the first holder's first write");
        // Checked, then frozen by the test before the write it decided on.
        assert!(guard.is_held());
        fs::write(dir.join("first.token"), token.as_u128().to_string()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while !dir.join("go").exists() {
            assert!(Instant::now() < deadline, "never told to go on");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let woke = Instant::now();
        let late = guard
            .fenced(&fence)
            .write(EtcdWrite::new().put(STORE, format!("first again {token}")))
            .await;
        let reason = tokio::time::timeout(Duration::from_secs(5), guard.lost())
            .await
            .expect("the woken holder is told of its loss");
        rec.lost(&key, reason);
        let told = woke.elapsed();
        let late = match late {
            Ok(Outcome::Stale { last }) => format!("refused {}", last.as_u128()),
            Ok(Outcome::Accepted(_)) => "accepted".into(),
            Err(e) => format!("failed: {e}"),
        };
        fs::write(
            dir.join("first.outcome"),
            format!("{late}\n{reason:?}\n{}", told.as_millis()),
        )
        .unwrap();
        let _ = release(guard, &key, &rec).await;
        m.flush().await;
    });
}

/// A worker process, killed if still running when dropped.
struct Worker {
    child: Child,
}

impl Worker {
    fn start(url: &str, key: &str, dir: &Path) -> Worker {
        let child = Command::new(std::env::current_exe().unwrap())
            .args([
                "frozen_holder::etcd_pause_worker_process",
                "--exact",
                "--ignored",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(WORKER, url)
            .env("ZKLOCK_KEY", key)
            .env("ZKLOCK_WORKER_DIR", dir)
            .stdin(Stdio::null())
            .stdout(fs::File::create(dir.join("first.log")).unwrap())
            .stderr(fs::File::create(dir.join("first.err")).unwrap())
            .spawn()
            .unwrap();
        Worker { child }
    }

    fn signal(&self, sig: &str) {
        faults::signal(self.child.id(), sig);
    }

    /// SIGSTOP, and wait until every thread of the process has stopped.
    fn freeze(&self) {
        faults::freeze(self.child.id(), "the worker");
    }

    /// Waits (bounded) for the worker to exit successfully.
    async fn finish(&mut self, dir: &Path) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                let err = fs::read_to_string(dir.join("first.err")).unwrap_or_default();
                assert!(status.success(), "the worker failed ({status}):\n{err}");
                return;
            }
            assert!(Instant::now() < deadline, "the worker did not finish");
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

/// 4. The holder's process frozen past its lease, then resumed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_frozen_past_its_lease_is_fenced_off_and_told_once_it_runs() {
    let etcd = blocking(EtcdServer::start).expect("start etcd");
    let dir = tempfile::tempdir().unwrap();
    let key = "frozen";
    let history = History::new();
    let mut first = Worker::start(&etcd.url(), key, dir.path());
    eventually("the first worker to hold", PROGRESS, || async {
        dir.path().join("first.token").exists()
    })
    .await;
    first.freeze();
    history.silent_fault("first", "SIGSTOP past the lease");
    let frozen = Instant::now();

    // Another process (this one) gets in once etcd lets the frozen holder's lease go.
    let second_m = etcd_manager(&etcd.url(), SHORT).await;
    let client = second_m
        .client::<zklock::etcd_client::Client>()
        .expect("an etcd manager's client");
    let fence = EtcdFence::new(client);
    let rec = history.recorder("second");
    let guard = hold(&second_m, key, &rec).await;
    let got_in = frozen.elapsed();
    let second = guard.fencing_token();
    let first_token: u128 = fs::read_to_string(dir.path().join("first.token"))
        .unwrap()
        .parse()
        .unwrap();
    assert!(second.as_u128() > first_token, "{second} > {first_token}");
    // Not before etcd let the lease go: at least the lease less the keep-alive period after
    // the freeze.
    assert!(got_in >= SHORT / 2, "{got_in:?}");
    let wrote = guard
        .fenced(&fence)
        .write(EtcdWrite::new().put(STORE, format!("second {second}")))
        .await
        .unwrap();
    assert!(wrote.is_accepted());
    release(guard, key, &rec).await.unwrap();

    fs::write(dir.path().join("go"), b"").unwrap();
    first.signal("-CONT");
    first.finish(dir.path()).await;
    history.load(&dir.path().join("first.history")).unwrap();
    let outcome = fs::read_to_string(dir.path().join("first.outcome")).unwrap();
    let lines: Vec<&str> = outcome.lines().collect();
    let stored = blocking(|| etcd.etcdctl(&["get", STORE, "--print-value-only"])).unwrap();

    let report = history.check();
    say(&format!(
        "fault_etcd (SIGSTOP): the second got in {got_in:?} after the freeze (lease {SHORT:?}); \
         the woken holder's write: {}, told {} ({} ms after waking); store: {}; {}",
        lines[0],
        lines[1],
        lines[2],
        stored.trim(),
        report.summary()
    ));
    assert_eq!(
        lines[0],
        format!("refused {}", second.as_u128()),
        "the fence refuses the older token and names the newer"
    );
    assert!(
        lines[1] == "LeaseExpired" || lines[1] == "NodeDeleted",
        "{}",
        lines[1]
    );
    let told_ms: u64 = lines[2].parse().unwrap();
    assert!(told_ms < 1_000, "told {told_ms} ms after waking");
    assert_eq!(
        stored.trim(),
        format!("second {second}"),
        "no late write landed"
    );
    // The lock behaved: the one overlap is the window the SIGSTOP opened, tokens increased.
    report.assert_ok();
    assert_eq!(report.unprotected.len(), 1, "{report}");
    let overlap = &report.unprotected[0];
    assert_eq!(
        (
            overlap.first.worker.as_str(),
            overlap.second.worker.as_str()
        ),
        ("first", "second")
    );
    assert!(overlap.second.token > overlap.first.token);
    assert_no_keys_left(&etcd, &[&second_m]).await;
}
