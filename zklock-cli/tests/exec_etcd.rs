//! `zklock --connect etcd://...` against a real etcd (the test kit's): `exec` runs its command
//! with the holder key's create revision as the fencing token, concurrent execs never overlap,
//! `exec` and `etcdctl lock` on the same lock exclude each other both ways, a timeout exits 75
//! and a holder whose lease could have ended exits 76; `ls` and `status` show holders and
//! waiters (etcdctl's too), `revoke` is refused with the reason; `elect` leads and a second
//! waits, with the participant id as the proposal `etcdctl elect -l` shows.

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::*;
use zklock_testkit::EtcdServer;

/// How long a side that must not get in is watched before it is asserted not to have.
const STILL_WAITS: Duration = Duration::from_millis(600);
/// The bound on anything that should happen promptly.
const PROMPTLY: Duration = Duration::from_secs(15);

fn etcd() -> EtcdServer {
    EtcdServer::start().expect("start etcd (test kit)")
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// etcdctl, as the test kit finds it: `$ZKLOCK_ETCDCTL`, else Debian's, else from `PATH`.
fn etcdctl_binary() -> PathBuf {
    if let Some(p) = std::env::var_os("ZKLOCK_ETCDCTL") {
        return p.into();
    }
    let debian = Path::new("/usr/bin/etcdctl");
    if debian.exists() {
        debian.into()
    } else {
        "etcdctl".into()
    }
}

/// A running etcdctl (killed when dropped), its standard output's lines read by a thread.
struct Etcdctl {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Etcdctl {
    /// Starts `etcdctl --endpoints=<etcd> <args>` with `ETCDCTL_API=3`.
    fn spawn(etcd: &EtcdServer, args: &[&str]) -> Etcdctl {
        let mut cmd = Command::new(etcdctl_binary());
        // etcdctl takes every ETCDCTL_* variable as a flag: only the API version is ours.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("ETCDCTL_") {
                cmd.env_remove(name);
            }
        }
        let mut child = cmd
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", etcd.endpoint()))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run etcdctl (Debian's etcd-client; scripts/setup installs it)");
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Etcdctl { child, lines }
    }

    /// The next line it prints within `within`, if any.
    fn line(&self, within: Duration) -> Option<String> {
        self.lines.recv_timeout(within).ok()
    }

    fn expect_line(&self) -> String {
        self.line(PROMPTLY)
            .unwrap_or_else(|| panic!("etcdctl printed no line within {PROMPTLY:?}"))
    }

    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits (bounded) for it to exit.
    fn exit(&mut self) -> ExitStatus {
        wait_bounded(&mut self.child, "etcdctl")
    }
}

impl Drop for Etcdctl {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits at most [`PROMPTLY`] for `child` to exit.
fn wait_bounded(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + PROMPTLY;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(
            Instant::now() < deadline,
            "{what} still runs after {PROMPTLY:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill(2) on a child we spawned and have not reaped; no memory effects.
    let r = unsafe { libc::kill(child.id() as libc::pid_t, signal) };
    assert_eq!(r, 0, "kill {}", child.id());
}

/// Keys under `prefix` in create order, each with its create revision and lease (as
/// `etcdctl get -w fields` shows them).
fn keys_under(etcd: &EtcdServer, prefix: &str) -> Vec<(String, i64, i64)> {
    let out = etcd
        .etcdctl(&[
            "get",
            "--prefix",
            prefix,
            "--sort-by=CREATE",
            "--order=ASCEND",
            "-w",
            "fields",
        ])
        .unwrap();
    let mut keys: Vec<(String, i64, i64)> = Vec::new();
    for line in out.lines() {
        match line.split_once(" : ") {
            Some(("\"Key\"", k)) => keys.push((k.trim_matches('"').to_string(), 0, 0)),
            Some(("\"CreateRevision\"", r)) => keys.last_mut().unwrap().1 = r.parse().unwrap(),
            Some(("\"Lease\"", l)) => keys.last_mut().unwrap().2 = l.parse().unwrap(),
            _ => {}
        }
    }
    keys
}

/// Waits (bounded) until `n` keys are queued under `prefix`.
fn until_keys(etcd: &EtcdServer, prefix: &str, n: usize) -> Vec<(String, i64, i64)> {
    let deadline = Instant::now() + PROMPTLY;
    loop {
        let keys = keys_under(etcd, prefix);
        if keys.len() == n {
            return keys;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} keys under {prefix}, have {keys:?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Waits (bounded) until `file` exists (written by a command), and returns its text.
fn until_file(file: &Path, child: &mut Child) -> String {
    let deadline = Instant::now() + PROMPTLY;
    loop {
        // Written with a rename: whole once it exists.
        if let Ok(text) = std::fs::read_to_string(file) {
            return text;
        }
        if let Some(status) = child.try_wait().unwrap() {
            panic!("exited ({status}) before writing {}", file.display());
        }
        assert!(
            Instant::now() < deadline,
            "{} never written",
            file.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A shell script that writes `words` (shell words, expanded) to `file` atomically.
fn write_file(file: &Path, words: &str) -> String {
    format!("echo {words} > {0}.tmp; mv {0}.tmp {0}", file.display())
}

/// `zklock exec KEY -- sh -c '<write token and path to FILE>; exec sleep 60'`, once its
/// command runs: the child, its token and its lock path.
fn hold(url: &str, global: &[&str], key: &str, dir: &Path) -> (Child, i64, String) {
    let file = dir.join(format!("held-{key}"));
    let script = format!(
        "{}; exec sleep 60",
        write_file(&file, "$ZKLOCK_FENCING_TOKEN $ZKLOCK_LOCK_PATH")
    );
    let mut child = zklock(url)
        .args(global)
        .args(["exec", key, "--", "sh", "-c", &script])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let text = until_file(&file, &mut child);
    let (token, path) = text.trim().split_once(' ').unwrap();
    (child, token.parse().unwrap(), path.to_string())
}

/// `exec` runs the command with the lock's path and a token (the holder key's create
/// revision: above every revision before the grant), and exits with the command's code.
#[test]
fn runs_the_command_with_the_token_and_returns_its_exit_code() {
    let etcd = etcd();
    etcd.etcdctl(&["put", "before", "x"]).unwrap();
    let before: i64 = etcd
        .etcdctl(&["get", "before", "-w", "fields"])
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("\"CreateRevision\" : "))
        .unwrap()
        .parse()
        .unwrap();
    let (token, path) = exec_token_and_path(&etcd.url(), &[]);
    assert!(token > before, "{token} > {before}");
    assert_eq!(path, "/zklock/locks/job%2F1");
    // Released: nothing left under the namespace.
    assert!(keys_under(&etcd, "/zklock/").is_empty());
}

/// Four concurrent `exec` on one key: never two commands inside at once, and each later
/// holder's token is larger.
#[test]
fn concurrent_execs_never_overlap_and_tokens_increase() {
    let etcd = etcd();
    concurrent_exec_tokens(&etcd.url());
}

/// `zklock exec` and `etcdctl lock` on the same lock (the CLI's namespace + "/" + key) exclude
/// each other both ways: etcdctl's command waits while zklock's runs, and runs once zklock's
/// holder ends; zklock times out (75) while etcdctl holds, and a waiting `zklock exec` runs
/// once etcdctl unlocks, with a token above etcdctl's key's create revision.
#[test]
fn exec_and_etcdctl_lock_exclude_each_other_both_ways() {
    let etcd = etcd();
    let url = etcd.url();
    let dir = tempfile::tempdir().unwrap();

    // zklock holds: etcdctl lock's command waits.
    let (mut holder, token, path) = hold(&url, &[], "deploy", dir.path());
    assert_eq!(path, "/zklock/locks/deploy");
    let prefix = format!("{path}/");
    let ran = dir.path().join("etcdctl-ran");
    let mut etcdctl = Etcdctl::spawn(
        &etcd,
        &[
            "lock",
            &path,
            "--",
            "sh",
            "-c",
            &write_file(&ran, "$(date +%s%N)"),
        ],
    );
    let queue = until_keys(&etcd, &prefix, 2);
    assert_eq!(queue[0].1, token, "zklock's key holds, with its token");
    std::thread::sleep(STILL_WAITS);
    assert!(
        !ran.exists(),
        "etcdctl ran its command while zklock exec held"
    );
    assert!(etcdctl.running());
    let released_at = now_ms();
    // SIGTERM: zklock forwards it to its command, releases and exits.
    signal(&holder, libc::SIGTERM);
    wait_bounded(&mut holder, "zklock exec");
    let status = etcdctl.exit();
    assert!(status.success(), "etcdctl lock: {status}");
    let ran_at: u64 = std::fs::read_to_string(&ran)
        .unwrap()
        .trim()
        .parse::<u64>()
        .unwrap()
        / 1_000_000;
    assert!(
        ran_at >= released_at,
        "etcdctl ran at {ran_at} ms, before zklock's holder ended at {released_at} ms"
    );

    // etcdctl holds: zklock exec times out, then waits until etcdctl unlocks.
    let mut locker = Etcdctl::spawn(&etcd, &["lock", &path]);
    let held = locker.expect_line();
    let theirs = until_keys(&etcd, &prefix, 1).remove(0);
    assert_eq!(theirs.0, held);
    let out = zklock(&url)
        .args(["exec", "deploy", "--timeout", "400ms", "--", "true"])
        .output()
        .unwrap();
    assert_exit(&out, 75);
    // It left nothing in etcdctl's queue (its key would hold up the next contender for its
    // lease's TTL).
    assert_eq!(keys_under(&etcd, &prefix), std::slice::from_ref(&theirs));
    let tok = dir.path().join("zklock-token");
    let mut waiter = zklock(&url)
        .args([
            "exec",
            "deploy",
            "--",
            "sh",
            "-c",
            &write_file(&tok, "$ZKLOCK_FENCING_TOKEN"),
        ])
        .spawn()
        .unwrap();
    until_keys(&etcd, &prefix, 2);
    std::thread::sleep(STILL_WAITS);
    assert!(!tok.exists(), "zklock exec ran while etcdctl held the lock");
    assert!(waiter.try_wait().unwrap().is_none());
    signal(&locker.child, libc::SIGTERM);
    assert!(locker.exit().success());
    let status = wait_bounded(&mut waiter, "the waiting zklock exec");
    assert_eq!(status.code(), Some(0));
    let token: i64 = std::fs::read_to_string(&tok)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        token > theirs.1,
        "zklock's token {token} must be above etcdctl's key's create revision {}",
        theirs.1
    );
}

/// `exec --timeout` exits 75 while another exec holds, and leaves nothing behind by the time
/// it exits (as it says); a holder (`--lease 2s`) whose etcd stops answering past its lease
/// loses the lock: its command gets SIGTERM and it exits 76.
#[test]
fn timeout_exits_75_and_a_lost_lease_exits_76() {
    let etcd = etcd();
    let url = etcd.url();
    let dir = tempfile::tempdir().unwrap();
    let (mut holder, _, path) = hold(&url, &[], "busy", dir.path());
    let prefix = format!("{path}/");
    let held = until_keys(&etcd, &prefix, 1);
    // Three times: the undo of a timed-out acquire raced the process's exit (before d0e5a82
    // the manager's own timeout dropped the acquire mid-undo, which nothing waited for).
    for _ in 0..3 {
        let out = zklock(&url)
            .args(["exec", "busy", "--timeout", "300ms", "--", "true"])
            .output()
            .unwrap();
        assert_exit(&out, 75);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("nothing is left"), "{stderr}");
        assert_eq!(
            keys_under(&etcd, &prefix),
            held,
            "a timed-out exec left its key"
        );
    }
    signal(&holder, libc::SIGTERM);
    wait_bounded(&mut holder, "zklock exec");

    let (holder, _, _) = hold(&url, &["--lease", "2s"], "paused", dir.path());
    let paused = Instant::now();
    etcd.pause().unwrap();
    let out = holder.wait_with_output().unwrap();
    let after = paused.elapsed();
    etcd.resume().unwrap();
    assert_exit(&out, 76);
    assert!(
        after < Duration::from_secs(5),
        "lost the lock {after:?} after etcd stopped answering; its lease is 2 s"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("lost the lock"), "{stderr}");
}

/// The row of `key` in `zklock ls`, split on whitespace.
fn ls_row(url: &str, key: &str) -> Vec<String> {
    let out = zklock(url).arg("ls").output().unwrap();
    assert_exit(&out, 0);
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with(&format!("{key} ")))
        .unwrap_or_else(|| panic!("a row for {key}: {text}"))
        .split_whitespace()
        .map(str::to_string)
        .collect()
}

/// `zklock status KEY`'s stdout.
fn status(url: &str, key: &str) -> String {
    let out = zklock(url).args(["status", key]).output().unwrap();
    assert_exit(&out, 0);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `ls` and `status` show a `zklock exec` holder (its token, its lease as the session, its key's
/// name as the node) and an `etcdctl lock` waiter; once etcdctl holds, they show etcdctl as the
/// holder with its key's create revision as the token. `revoke` is refused (69) with the reason
/// and the way to do it on etcd.
#[test]
fn ls_and_status_show_holders_and_waiters_and_revoke_is_refused() {
    let etcd = etcd();
    let url = etcd.url();
    let dir = tempfile::tempdir().unwrap();
    only_revoke_is_unsupported(&url, "etcd");

    let (mut holder, token, path) = hold(&url, &[], "report", dir.path());
    let prefix = format!("{path}/");
    let etcdctl = Etcdctl::spawn(&etcd, &["lock", &path]);
    let queue = until_keys(&etcd, &prefix, 2);
    let (ours, theirs) = (&queue[0], &queue[1]);

    let row = ls_row(&url, "report");
    assert_eq!(row[1], "mutex", "{row:?}");
    assert_eq!(row[row.len() - 3], "1", "one waiter: {row:?}");
    assert_eq!(row[row.len() - 1], token.to_string(), "{row:?}");

    let text = status(&url, "report");
    assert!(text.contains(&format!("path: {path}")), "{text}");
    let holder_line = text.lines().find(|l| l.starts_with("holder")).unwrap();
    let waiter_line = text.lines().find(|l| l.starts_with("waiter")).unwrap();
    assert_eq!(text.lines().filter(|l| l.starts_with("holder")).count(), 1);
    assert!(
        holder_line.contains(&format!("token {token} "))
            && holder_line.contains(&format!("session 0x{:x} ", ours.2))
            && holder_line.ends_with(&format!("node {:x}", ours.2)),
        "{text}"
    );
    assert_eq!(
        ours.0,
        format!("{prefix}{:x}", ours.2),
        "a concurrency.Mutex key"
    );
    assert!(
        waiter_line.contains(&format!("session 0x{:x} ", theirs.2))
            && waiter_line.ends_with(&format!("node {:x}", theirs.2)),
        "{text}"
    );

    let out = zklock(&url).args(["revoke", "report"]).output().unwrap();
    assert_eq!(out.status.code(), Some(69));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("etcd backend does not support revocation")
            && stderr.contains("etcdctl lease revoke"),
        "{stderr}"
    );
    assert!(
        holder.try_wait().unwrap().is_none(),
        "revoke ended the holder"
    );

    // zklock's holder ends: etcdctl holds, and that is what ls and status show.
    signal(&holder, libc::SIGTERM);
    wait_bounded(&mut holder, "zklock exec");
    assert_eq!(etcdctl.expect_line(), theirs.0);
    let row = ls_row(&url, "report");
    assert_eq!(row[row.len() - 1], theirs.1.to_string(), "{row:?}");
    let text = status(&url, "report");
    let holder_line = text.lines().find(|l| l.starts_with("holder")).unwrap();
    assert!(
        holder_line.contains(&format!("token {} ", theirs.1))
            && holder_line.ends_with(&format!("node {:x}", theirs.2)),
        "{text}"
    );
    assert!(!text.contains("waiter"), "{text}");
}

/// `zklock elect` on etcd: the first participant leads and runs its command, a second waits
/// (its command does not run) until the first ends, then leads with a larger epoch.
/// `etcdctl elect -l` shows each leader's participant id as etcd's proposal.
#[test]
fn elect_leads_and_a_second_waits() {
    let etcd = etcd();
    let url = etcd.url();
    let dir = tempfile::tempdir().unwrap();
    let spawn = |id: &str| {
        let file = dir.path().join(id);
        let script = format!(
            "{}; exec sleep 60",
            write_file(&file, "$ZKLOCK_LEADER_EPOCH $ZKLOCK_ELECTION_PATH")
        );
        let child = zklock(&url)
            .args(["elect", "nightly", "--id", id, "--", "sh", "-c", &script])
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        (child, file)
    };

    let (mut first, first_file) = spawn("p1");
    let text = until_file(&first_file, &mut first);
    let (epoch1, path) = text.trim().split_once(' ').unwrap();
    let epoch1: i64 = epoch1.parse().unwrap();
    let prefix = format!("{path}/");
    let observer = Etcdctl::spawn(&etcd, &["elect", "-l", path]);
    let leader_key = observer.expect_line();
    assert_eq!(observer.expect_line(), "p1");
    assert_eq!(keys_under(&etcd, &prefix)[0].0, leader_key);

    let (mut second, second_file) = spawn("p2");
    until_keys(&etcd, &prefix, 2);
    assert_eq!(observer.line(STILL_WAITS), None, "the leader changed");
    assert!(!second_file.exists(), "two leaders at once");
    assert!(second.try_wait().unwrap().is_none());

    let ended_at = Instant::now();
    signal(&first, libc::SIGTERM);
    wait_bounded(&mut first, "the first leader");
    let text = until_file(&second_file, &mut second);
    assert!(ended_at.elapsed() < Duration::from_secs(5));
    let (epoch2, path2) = text.trim().split_once(' ').unwrap();
    assert_eq!(path2, path);
    assert!(
        epoch2.parse::<i64>().unwrap() > epoch1,
        "{epoch2} > {epoch1}"
    );
    observer.expect_line();
    assert_eq!(observer.expect_line(), "p2");
    signal(&second, libc::SIGTERM);
    wait_bounded(&mut second, "the second leader");
}
