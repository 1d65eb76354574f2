//! `zklock --connect redis+sentinel://<Sentinels>/<master> ...` against the test kit's Redis
//! primary with 2 replicas and 3 Sentinels: `exec` keeps holders apart and hands each later
//! holder a larger token, `ls` and `status` show the holder as the primary has it, `revoke` is
//! refused as on one Redis server; and after a failover the holder that ran through it is told
//! (exit 76) and the next holder's token is above every token handed out before.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use zklock_testkit::RedisSentinel;

/// The Sentinel setup that the tests which never fail it over share (6 processes). A static
/// is never dropped: [`stop_shared_at_exit`] stops it when the test process exits (should the
/// process be killed outright, the kit's watchdogs kill the servers).
static SHARED: Mutex<Option<Arc<RedisSentinel>>> = Mutex::new(None);

/// The shared setup, started on first use.
fn shared() -> Arc<RedisSentinel> {
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(setup) = &*slot {
        return setup.clone();
    }
    let setup = Arc::new(start());
    *slot = Some(setup.clone());
    stop_shared_at_exit();
    setup
}

fn stop_shared_at_exit() {
    extern "C" fn stop() {
        if let Ok(mut slot) = SHARED.try_lock() {
            drop(slot.take());
        }
    }
    // SAFETY: the C library's atexit(3), given an `extern "C" fn()` that never unwinds.
    assert_eq!(unsafe { libc::atexit(stop) }, 0, "atexit refused the stop");
}

fn start() -> RedisSentinel {
    RedisSentinel::start().expect("start Redis with Sentinels (test kit)")
}

/// `redis+sentinel://<every Sentinel>/<master name>`.
fn url(redis: &RedisSentinel) -> String {
    format!(
        "redis+sentinel://{}/{}",
        redis.sentinel_addrs().join(","),
        redis.master_name()
    )
}

/// A running `zklock exec KEY`, whose command wrote the token it was given and stays inside
/// its critical section (the directory `inside`) until SIGTERM.
struct Holder {
    child: Child,
    token: i64,
    inside: PathBuf,
}

/// Starts `zklock [global...] exec KEY -- sh -c '...'` whose command enters the critical
/// section of KEY (`mkdir`, atomic: it fails, exit 99, while another command is inside), writes
/// its token, and waits for SIGTERM, on which it leaves (`rmdir`) and exits 0. Returns once the
/// command runs (the lock is held), with the token it was given.
fn hold(connect: &str, global: &[&str], key: &str, dir: &Path) -> Holder {
    let name = key.replace('/', "_");
    let mark = dir.join(format!("token-{name}"));
    let inside = dir.join(format!("inside-{name}"));
    // The mark is written to a temporary name and renamed: it appears with its whole content.
    let script = format!(
        "mkdir {i} || exit 99; trap 'rmdir {i}; kill $! 2>/dev/null; exit 0' TERM; \
         echo $ZKLOCK_FENCING_TOKEN > {m}.tmp && mv {m}.tmp {m}; sleep 60 & wait",
        i = inside.display(),
        m = mark.display()
    );
    let mut child = zklock(connect)
        .args(global)
        .args(["exec", key, "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !mark.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the holder of {key} exited ({status}) before its command ran");
        }
        assert!(Instant::now() < deadline, "the holder never held {key}");
        std::thread::sleep(Duration::from_millis(20));
    }
    let token = std::fs::read_to_string(&mark).unwrap();
    let token = token
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a token: {token:?}"));
    Holder {
        child,
        token,
        inside,
    }
}

/// Sends the holder SIGTERM (zklock forwards it to its command, releases, exits) and waits.
fn end(holder: Holder) -> Output {
    // SAFETY: kill(2) on a child we spawned and have not reaped; no memory effects.
    unsafe { libc::kill(holder.child.id() as libc::pid_t, libc::SIGTERM) };
    wait_bounded(holder.child, Duration::from_secs(30))
}

/// Waits for `child` at most `bound` (then kills it and fails), with its output.
fn wait_bounded(mut child: Child, bound: Duration) -> Output {
    let deadline = Instant::now() + bound;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "still running after {bound:?}; stderr: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

/// `zklock exec KEY` whose command enters `inside` as [`hold`]'s does (exit 99 if another is
/// inside), prints its token and leaves; spawned. [`token_of`] reads what it printed.
fn spawn_exec_token(connect: &str, global: &[&str], key: &str, inside: &Path) -> Child {
    let script = format!(
        "mkdir {i} || exit 99; echo $ZKLOCK_FENCING_TOKEN; rmdir {i}",
        i = inside.display()
    );
    zklock(connect)
        .args(global)
        .args(["exec", key, "--", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// The token a [`spawn_exec_token`] printed, once it exited 0 (not 99: it was alone in its
/// critical section).
fn token_of(out: &Output) -> i64 {
    assert_exit(out, 0);
    let stdout = String::from_utf8_lossy(&out.stdout);
    stdout
        .trim()
        .parse()
        .unwrap_or_else(|_| panic!("a token: {stdout:?}"))
}

fn run(connect: &str, args: &[&str]) -> (String, String) {
    let out = zklock(connect).args(args).output().unwrap();
    assert_exit(&out, 0);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn tempdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    (dir, path)
}

/// Through the Sentinels: the command runs on the primary with a token and the lock's path;
/// a second `exec` of a held key waits (or times out, exit 75) and runs once the first ends,
/// with a larger token; four at once never overlap and their tokens increase.
#[test]
fn exec_keeps_holders_apart_and_hands_the_next_a_larger_token() {
    let redis = shared();
    let url = url(&redis);
    let ns = ["--namespace", "/zklock/exec_apart"];
    let (token, path) = exec_token_and_path(&url, &ns);
    // The fence counter starts at the server's time in µs.
    assert!(token > 1_600_000_000_000_000, "{token}");
    assert_eq!(path, "/zklock/exec_apart/job%2F1");

    let (_dir, dir) = tempdir();
    let first = hold(&url, &ns, "apart", &dir);
    let out = zklock(&url)
        .args(ns)
        .args(["exec", "apart", "--timeout", "300ms", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 75);
    // The second waits behind the first: had it run while the first is inside, its command
    // would have exited 99.
    let second = spawn_exec_token(&url, &ns, "apart", &first.inside);
    let first_token = first.token;
    assert_exit(&end(first), 0);
    let second_token = token_of(&wait_bounded(second, Duration::from_secs(30)));
    assert!(
        second_token > first_token,
        "{second_token} after {first_token}"
    );

    // Four at once: each alone inside, tokens increasing in the order they ran.
    let tokens = concurrent_exec_tokens(&url);
    assert!(tokens[0] > second_token, "{tokens:?} after {second_token}");
}

/// `ls` and `status` read the holder from the primary the Sentinels name: the key, its kind and
/// the holder's token; nothing once it ended. `revoke` is refused as on one Redis server.
#[test]
fn ls_and_status_show_the_holder_and_revoke_is_refused() {
    let redis = shared();
    let url = url(&redis);
    let ns = ["--namespace", "/zklock/operators"];
    let (out, _) = run(&url, &["--namespace", "/zklock/operators", "ls"]);
    assert!(out.contains("no locks"), "{out}");

    let (_dir, dir) = tempdir();
    let holder = hold(&url, &ns, "invoice/7", &dir);
    let token = holder.token.to_string();
    let (out, _) = run(&url, &["--namespace", "/zklock/operators", "ls"]);
    let line = out
        .lines()
        .find(|l| l.starts_with("invoice/7 "))
        .unwrap_or_else(|| panic!("a row for invoice/7: {out}"));
    let row: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(row[1], "mutex", "{out}");
    assert_eq!(row[row.len() - 1], token, "{out}");
    let (out, _) = run(
        &url,
        &["--namespace", "/zklock/operators", "status", "invoice/7"],
    );
    let holder_line = out.lines().find(|l| l.starts_with("holder")).unwrap_or("");
    assert!(holder_line.contains(&token), "{out}");

    assert_exit(&end(holder), 0);
    let (out, _) = run(&url, &["--namespace", "/zklock/operators", "ls"]);
    assert!(out.contains("no locks"), "{out}");

    only_revoke_is_unsupported(&url, "redis");
}

/// A failover forced through the Sentinels (`SENTINEL FAILOVER`): the `exec` holding through it
/// is told its hold is lost (its command gets SIGTERM, it exits 76), and the next holders of
/// that key and of another key get tokens above every token handed out before the failover.
#[test]
fn after_a_failover_the_next_token_is_above_every_earlier_one() {
    let redis = start();
    let url = url(&redis);
    let (_dir, dir) = tempdir();
    let mut before = vec![];
    for _ in 0..3 {
        before.push(exec_token_and_path(&url, &[]).0);
    }
    let holder = hold(&url, &["--lease", "3s"], "through", &dir);
    before.push(holder.token);
    let old = redis.primary().unwrap();
    let new = redis.failover().expect("a failover to a replica");
    assert_ne!(old, new);

    let out = wait_bounded(holder.child, Duration::from_secs(30));
    assert_exit(&out, 76);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lost the lock"), "{stderr}");

    let highest = *before.iter().max().unwrap();
    let again = token_of(&wait_bounded(
        spawn_exec_token(&url, &[], "through", &dir.join("inside-through")),
        Duration::from_secs(30),
    ));
    assert!(again > highest, "{again} after {before:?}");
    let (other, _) = exec_token_and_path(&url, &[]);
    assert!(other > highest, "{other} after {before:?}");
}

/// Sentinels with a password of their own: `--sentinel-password` (here from
/// `ZKLOCK_SENTINEL_PASSWORD`, which `ps` does not show) lets `exec` through; without it the
/// tool stops at connect with a usage error naming the flag; on another backend's address the
/// flag is refused.
#[test]
fn sentinels_with_a_password_take_sentinel_password() {
    let redis = start();
    let url = url(&redis);
    for j in 0..redis.len() {
        redis
            .sentinel_command(j, &["ACL", "SETUSER", "default", "on", ">sentinel-pw"])
            .expect("set the Sentinel's password");
    }
    let out = zklock(&url)
        .args(["exec", "job/pw", "--", "true"])
        .env_remove("ZKLOCK_SENTINEL_PASSWORD")
        .output()
        .unwrap();
    assert_exit(&out, 64);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--sentinel-password"), "{stderr}");
    let out = zklock(&url)
        .args(["exec", "job/pw", "--", "true"])
        .env("ZKLOCK_SENTINEL_PASSWORD", "sentinel-pw")
        .output()
        .unwrap();
    assert_exit(&out, 0);
    let out = zklock("127.0.0.1:1")
        .args(["--sentinel-password", "x", "ls"])
        .output()
        .unwrap();
    assert_exit(&out, 64);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("redis+sentinel://"), "{stderr}");
}
