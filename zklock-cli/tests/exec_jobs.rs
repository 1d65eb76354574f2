//! `zklock exec` of a scheduled job against a real server: concurrent cron runs with
//! `--skip-if-locked` run the command once, a skip exits 0 (or `--skipped-exit-code`) with one
//! line on stderr, `--at-least` holds across the runner's exit, `--at-most` stops a command
//! that ignores SIGTERM (SIGKILL after `--kill-after`) and exits 124, and misused job options
//! exit 64 before connecting.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use zklock_core::{LockManager, Ran};
use zklock_testkit::ZkServer;

fn zklock(connect: &str) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_zklock"));
    c.args(["--connect", connect, "--session-timeout", "4s"]);
    c
}

/// Lines of a file the commands append to (none when it does not exist yet).
fn lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .map(|text| text.lines().map(str::to_string).collect())
        .unwrap_or_default()
}

/// Waits (bounded) until one of `children` has exited; returns its index and output.
fn first_to_exit(children: &mut Vec<Child>) -> (usize, Output) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        for i in 0..children.len() {
            if children[i].try_wait().unwrap().is_some() {
                return (i, children.remove(i).wait_with_output().unwrap());
            }
        }
        assert!(Instant::now() < deadline, "no exec exited");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn concurrent_execs_with_skip_if_locked_run_the_command_once() {
    let zk = ZkServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let release = dir.path().join("release");
    // The command runs until the test lets it end: the other exec finds the job held.
    let script = format!(
        "echo ran $ZKLOCK_FENCING_TOKEN $ZKLOCK_LOCK_PATH >> {log}; while [ ! -e {release} ]; do sleep 0.05; done",
        log = log.display(),
        release = release.display()
    );
    let mut children: Vec<Child> = (0..2)
        .map(|_| {
            zklock(&zk.connect_string())
                .args(["exec", "nightly", "--skip-if-locked", "--", "sh", "-c"])
                .arg(&script)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let (_, skipped) = first_to_exit(&mut children);
    let stderr = String::from_utf8_lossy(&skipped.stderr);
    assert_eq!(skipped.status.code(), Some(0), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "one line on a skip: {stderr}");
    assert!(stderr.contains("skipped nightly"), "{stderr}");

    std::fs::write(&release, "").unwrap();
    let ran = children.pop().unwrap().wait_with_output().unwrap();
    assert_eq!(
        ran.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    let runs = lines(&log);
    assert_eq!(
        runs.len(),
        1,
        "the command ran {} times: {runs:?}",
        runs.len()
    );
    // It ran under the job's lock, with its token.
    let fields: Vec<&str> = runs[0].split(' ').collect();
    assert!(fields[1].parse::<i64>().unwrap() > 0, "{runs:?}");
    assert_eq!(fields[2], "/zklock/locks/nightly");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skip_exits_with_skipped_exit_code_and_shares_the_lock_with_the_library() {
    let zk = ZkServer::start().unwrap();
    let m = LockManager::connect(zk.connect_string()).await.unwrap();
    // The library's job of the same name is running: the shell's run skips it.
    let (started_tx, started_rx) = tokio::sync::oneshot::channel();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let job = m.job("reindex").unwrap();
    let running = tokio::spawn(async move {
        job.run(async {
            started_tx.send(()).unwrap();
            let _ = stop_rx.await;
        })
        .await
    });
    started_rx.await.unwrap();
    let connect = zk.connect_string();
    let out = tokio::task::spawn_blocking(move || {
        zklock(&connect)
            .args([
                "exec",
                "reindex",
                "--skip-if-locked",
                "--skipped-exit-code",
                "3",
                "--",
                "sh",
                "-c",
                "exit 9",
            ])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{stderr}");
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    stop_tx.send(()).unwrap();
    assert_eq!(running.await.unwrap().unwrap(), Ran::Ran(()));
}

#[test]
fn at_least_holds_across_the_runners_exit() {
    let zk = ZkServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");
    let window = Duration::from_secs(3);
    let run = |label: &str| {
        zklock(&zk.connect_string())
            .args([
                "exec",
                "report",
                "--skip-if-locked",
                "--at-least",
                "3s",
                "--",
                "sh",
                "-c",
            ])
            .arg(format!("echo {label} >> {}", log.display()))
            .output()
            .unwrap()
    };
    let started = Instant::now();
    let first = run("first");
    assert_eq!(first.status.code(), Some(0));
    assert_eq!(lines(&log), ["first"], "the first run ran");

    // The first process has exited; within the window a second run is skipped.
    let second = run("second");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("skipped report"), "{stderr}");
    assert_eq!(lines(&log), ["first"], "ran again within --at-least");
    assert!(
        started.elapsed() < window,
        "the test was too slow to check the window"
    );

    // After the window, a run runs.
    let deadline = Instant::now() + Duration::from_secs(20);
    while lines(&log).len() == 1 {
        assert!(Instant::now() < deadline, "the job never ran again");
        let again = run("again");
        assert_eq!(again.status.code(), Some(0));
    }
    assert_eq!(lines(&log), ["first", "again"]);
    // Server and test share this machine's clock: it ran again no sooner than the window.
    assert!(
        started.elapsed() >= window - Duration::from_millis(50),
        "ran again after {:?}, inside the {window:?} window",
        started.elapsed()
    );
}

/// Whether `pid` is gone (or a zombie that nobody runs any more).
fn is_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z')),
    }
}

#[test]
fn at_most_stops_a_long_command_and_exits_124() {
    let zk = ZkServer::start().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("pid");
    // The command and the sleep it starts ignore SIGTERM: only SIGKILL stops them.
    let script = format!(
        "trap '' TERM; sleep 60 & echo $! > {}; wait",
        pidfile.display()
    );
    let started = Instant::now();
    let out = zklock(&zk.connect_string())
        .args([
            "exec",
            "stuck",
            "--skip-if-locked",
            "--at-most",
            "1s",
            "--kill-after",
            "500ms",
            "--",
            "sh",
            "-c",
        ])
        .arg(&script)
        .output()
        .unwrap();
    let took = started.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(124), "{stderr}");
    assert!(stderr.contains("ran past --at-most 1s"), "{stderr}");
    assert!(stderr.contains("SIGKILL"), "{stderr}");
    assert!(
        took >= Duration::from_millis(1500),
        "stopped after {took:?}"
    );
    // What the command started is stopped too (its process group got the signals).
    let sleep: u32 = std::fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !is_gone(sleep) {
        assert!(Instant::now() < deadline, "the command's sleep still runs");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The job was given up: the next run runs at once.
    let next = zklock(&zk.connect_string())
        .args([
            "exec",
            "stuck",
            "--skip-if-locked",
            "--",
            "sh",
            "-c",
            "exit 5",
        ])
        .output()
        .unwrap();
    assert_eq!(
        next.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&next.stderr)
    );
}

#[test]
fn misused_job_options_exit_64_before_connecting() {
    // Nothing listens here: the options are refused before any connection attempt.
    let nowhere = "127.0.0.1:1";
    let cases: &[(&[&str], &str)] = &[
        (&["--at-least", "30s"], "--skip-if-locked"),
        (&["--at-most", "1m"], "--timeout DUR"),
        (&["--skipped-exit-code", "3"], "option of a job run"),
        (&["--kill-after", "1s"], "option of a job run"),
        (
            &["--skip-if-locked", "--at-least", "0s"],
            "longer than zero",
        ),
        (
            &["--skip-if-locked", "--timeout", "1s"],
            "cannot be used with",
        ),
        (&["--skip-if-locked", "--read"], "cannot be used with"),
        (&["--skip-if-locked", "--at-most", "soon"], "invalid value"),
    ];
    for (flags, says) in cases {
        let out = zklock(nowhere)
            .args(["exec", "k"])
            .args(*flags)
            .args(["--", "true"])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(64), "{flags:?}: {stderr}");
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}
