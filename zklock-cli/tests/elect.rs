//! `zklock elect` against a real server: one leader runs its command at a time, with an
//! increasing epoch; a leader that loses its leadership stops its command (SIGTERM, then
//! SIGKILL for one that ignores it) and exits 76.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use zklock_core::LockManager;
use zklock_testkit::ZkServer;

fn zklock(connect: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zklock"));
    c.args(["--connect", connect, "--session-timeout", "4s"]);
    c
}

#[test]
fn leaders_take_turns_with_increasing_epochs() {
    let zk = ZkServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let script = format!(
        "echo start $ZKLOCK_LEADER_EPOCH >> {0}; sleep 0.3; echo end $ZKLOCK_LEADER_EPOCH >> {0}",
        log.display()
    );
    let children: Vec<_> = (0..3)
        .map(|i| {
            zklock(&zk.connect_string())
                .args([
                    "elect",
                    "nightly",
                    "--id",
                    &format!("p{i}"),
                    "--",
                    "sh",
                    "-c",
                ])
                .arg(&script)
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert_eq!(c.wait().unwrap().code(), Some(0));
    }
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<(&str, u64)> = text
        .lines()
        .map(|l| {
            let (what, epoch) = l.split_once(' ').unwrap();
            (what, epoch.parse().unwrap())
        })
        .collect();
    assert_eq!(lines.len(), 6, "{text}");
    // Every start is followed by its own end before the next start: never two leaders.
    for pair in lines.chunks(2) {
        assert_eq!(pair[0].0, "start", "{text}");
        assert_eq!(pair[1], ("end", pair[0].1), "{text}");
    }
    let epochs: Vec<u64> = lines.iter().step_by(2).map(|l| l.1).collect();
    assert!(epochs.windows(2).all(|w| w[0] < w[1]), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_that_loses_leadership_stops_its_command_and_exits_76() {
    let zk = ZkServer::start().unwrap();
    let watcher = LockManager::connect(zk.connect_string()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ignoring = dir.path().join("ignoring-sigterm");
    // The command ignores SIGTERM (and says so in a file): only the SIGKILL after
    // --kill-after stops it.
    let leader = zklock(&zk.connect_string())
        .args([
            "elect",
            "--path",
            "/jobs/leader",
            "--kill-after",
            "1s",
            "--",
            "sh",
            "-c",
            "trap '' TERM; touch \"$0\"; sleep 60",
        ])
        .arg(&ignoring)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let client = watcher
        .client::<zklock_core::zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    let deadline = Instant::now() + Duration::from_secs(30);
    let node = loop {
        let kids = client
            .list_children("/jobs/leader")
            .await
            .unwrap_or_default();
        if let Some(k) = kids.first() {
            break format!("/jobs/leader/{k}");
        }
        assert!(Instant::now() < deadline, "the leader never joined");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // Once the leader's command ignores SIGTERM, depose the leader.
    while !ignoring.exists() {
        assert!(
            Instant::now() < deadline,
            "the leader's command never started"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let deposed = Instant::now();
    client.delete(&node, None).await.unwrap();
    let status = tokio::task::spawn_blocking(move || leader.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    let stopped_in = deposed.elapsed();
    let stderr = String::from_utf8_lossy(&status.stderr);
    assert_eq!(status.status.code(), Some(76), "{stderr}");
    assert!(stderr.contains("SIGKILL"), "{stderr}");
    assert!(
        stopped_in < Duration::from_secs(10),
        "stopped {stopped_in:?} after losing leadership"
    );
}
