//! Interop with etcd's own tools on the same lock paths, both ways: `etcdctl lock` (etcd's
//! `concurrency.Mutex`) and `etcdctl elect` (`concurrency.Election`) against zklock's mutex and
//! leader latch on etcd; one queue between them in create-revision order (a waiter that leaves
//! it hands nothing on); a lease ended from outside (SIGKILL then TTL, `etcdctl lease revoke`)
//! frees the lock for the other side; and the key layout they share
//! (`<path>/<lease id in hex>`).
//!
//! etcdctl runs as a child process (Debian's etcd-client, 3.4, as the test kit finds it) against
//! a real etcd from the test kit, and the keys are read with etcdctl too (`get -w fields`), as
//! etcd's tools see them. Every "still waits" is a bounded wait after which the other side is
//! shown not to have got in (its command's marker file is absent, it printed nothing, its task
//! is not finished), and every "then gets in" is shown by what that side itself reports.

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};
use zklock::{Error, LockManager, LossReason};
use zklock_testkit::{now_epoch_ms, EtcdServer};

/// The managers' lease: short enough that nothing here waits on it, long enough for a loaded
/// machine.
const LEASE: Duration = Duration::from_secs(3);
/// How long a side that must not get in is watched before it is asserted not to have.
const STILL_WAITS: Duration = Duration::from_millis(600);
/// The bound on anything that should happen promptly (a hand-over, a line from etcdctl).
const PROMPTLY: Duration = Duration::from_secs(10);

fn etcd() -> EtcdServer {
    EtcdServer::start().expect("start etcd (test kit)")
}

async fn manager(etcd: &EtcdServer) -> LockManager {
    LockManager::builder(etcd.url())
        .etcd(|e| e.lease(LEASE))
        .connect()
        .await
        .expect("connect to etcd")
}

/// Runs etcdctl against `etcd` (off the runtime's worker) and returns what it printed.
fn ctl(etcd: &EtcdServer, args: &[&str]) -> String {
    tokio::task::block_in_place(|| etcd.etcdctl(args)).unwrap_or_else(|e| panic!("{e}"))
}

/// One key under a lock's prefix, as etcd has it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    key: String,
    value: String,
    create_revision: i64,
    lease: i64,
}

/// A string field of etcdctl's `-w fields` output (Go's `%q`), unquoted.
fn unquote(text: &str) -> String {
    let inner = text
        .strip_prefix('"')
        .and_then(|t| t.strip_suffix('"'))
        .unwrap_or_else(|| panic!("a quoted field: {text}"));
    inner.replace("\\\"", "\"").replace("\\\\", "\\")
}

/// The keys under `prefix` in create-revision order (the queue every tool reads), as
/// `etcdctl get --prefix -w fields` shows them.
fn keys_under(etcd: &EtcdServer, prefix: &str) -> Vec<Entry> {
    let out = ctl(
        etcd,
        &[
            "get",
            "--prefix",
            prefix,
            "--sort-by=CREATE",
            "--order=ASCEND",
            "-w",
            "fields",
        ],
    );
    let mut entries: Vec<Entry> = Vec::new();
    for line in out.lines() {
        let Some((name, value)) = line.split_once(" : ") else {
            continue;
        };
        match name {
            "\"Key\"" => entries.push(Entry {
                key: unquote(value),
                value: String::new(),
                create_revision: 0,
                lease: 0,
            }),
            "\"CreateRevision\"" => {
                entries.last_mut().unwrap().create_revision = value.parse().unwrap()
            }
            "\"Value\"" => entries.last_mut().unwrap().value = unquote(value),
            "\"Lease\"" => entries.last_mut().unwrap().lease = value.parse().unwrap(),
            _ => {}
        }
    }
    entries
}

/// Waits (bounded) until `n` keys are queued under `prefix`, and returns them.
async fn until_keys(etcd: &EtcdServer, prefix: &str, n: usize) -> Vec<Entry> {
    let deadline = tokio::time::Instant::now() + PROMPTLY;
    loop {
        let keys = keys_under(etcd, prefix);
        if keys.len() == n {
            return keys;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "expected {n} keys under {prefix}, have {keys:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Lease `id`'s remaining and granted TTL in seconds (-1 remaining once it ended), as
/// `etcdctl lease timetolive -w fields` shows them.
fn lease_ttl(etcd: &EtcdServer, id: i64) -> (i64, i64) {
    let out = ctl(
        etcd,
        &["lease", "timetolive", &format!("{id:x}"), "-w", "fields"],
    );
    let field = |name: &str| -> i64 {
        out.lines()
            .find_map(|l| l.strip_prefix(&format!("\"{name}\" : ")))
            .unwrap_or_else(|| panic!("no {name} in {out}"))
            .parse()
            .unwrap()
    };
    (field("TTL"), field("GrantedTTL"))
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

/// A running etcdctl (killed if the test ends first), its standard output read line by line.
struct Etcdctl {
    child: Child,
    stdout: Lines<BufReader<ChildStdout>>,
    what: String,
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
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("run etcdctl (Debian's etcd-client; scripts/setup installs it)");
        let stdout = BufReader::new(child.stdout.take().unwrap()).lines();
        Etcdctl {
            child,
            stdout,
            what: format!("etcdctl {}", args.join(" ")),
        }
    }

    /// The next line it prints within `within`; `None` when it prints none by then (or exits).
    async fn line(&mut self, within: Duration) -> Option<String> {
        match tokio::time::timeout(within, self.stdout.next_line()).await {
            Ok(Ok(line)) => line,
            Ok(Err(e)) => panic!("read the output of {}: {e}", self.what),
            Err(_) => None,
        }
    }

    /// The next line, which must come promptly.
    async fn expect_line(&mut self) -> String {
        self.line(PROMPTLY)
            .await
            .unwrap_or_else(|| panic!("{} printed no line within {PROMPTLY:?}", self.what))
    }

    /// Sends it `signal` (`TERM`, `INT`, `KILL`).
    fn signal(&self, signal: &str) {
        let pid = self.child.id().expect("etcdctl still runs").to_string();
        let status = std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid])
            .status()
            .unwrap();
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Whether it still runs.
    fn running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Waits (bounded) for it to exit.
    async fn exit(&mut self) -> ExitStatus {
        tokio::time::timeout(PROMPTLY, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("{} still runs after {PROMPTLY:?}", self.what))
            .unwrap()
    }
}

/// `date +%s%N` written by a shell command, in milliseconds since the epoch.
fn ms_of_ns(text: &str) -> u64 {
    text.trim()
        .parse::<u64>()
        .unwrap_or_else(|_| panic!("a time in ns: {text:?}"))
        / 1_000_000
}

/// While zklock holds a mutex, `etcdctl lock <its path> <cmd>` queues behind it and does not
/// run its command; once zklock releases, etcdctl gets the lock and runs it: etcd's
/// `concurrency.Mutex` honours zklock's holder key, and zklock's release wakes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zklock_holder_keeps_etcdctl_lock_from_running_its_command_until_it_releases() {
    let etcd = etcd();
    let m = manager(&etcd).await;
    let path = m.path_of("interop/nightly").unwrap();
    let prefix = format!("{path}/");
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");

    let guard = m.lock("interop/nightly").await.unwrap();
    let script = format!(
        "date +%s%N > {0}.tmp; echo \"$ETCD_LOCK_KEY\" >> {0}.tmp; mv {0}.tmp {0}",
        ran.display()
    );
    let mut etcdctl = Etcdctl::spawn(&etcd, &["lock", &path, "--", "sh", "-c", &script]);
    let queue = until_keys(&etcd, &prefix, 2).await;
    assert_eq!(queue[0].create_revision, guard.fencing_token().grant());
    let theirs = queue[1].clone();

    // etcdctl waits: its command does not run while zklock holds.
    tokio::time::sleep(STILL_WAITS).await;
    assert!(
        !ran.exists(),
        "etcdctl ran its command while zklock held the lock"
    );
    assert!(etcdctl.running(), "etcdctl gave up waiting");
    assert!(guard.is_held());

    let released_at = now_epoch_ms();
    guard.release().await.unwrap();
    let status = etcdctl.exit().await;
    assert!(status.success(), "etcdctl lock: {status}");
    let text = std::fs::read_to_string(&ran).expect("etcdctl ran its command");
    let (at, key) = text.split_once('\n').unwrap();
    assert!(
        ms_of_ns(at) >= released_at,
        "etcdctl ran its command at {} ms, zklock released at {released_at} ms",
        ms_of_ns(at)
    );
    assert_eq!(
        key.trim(),
        theirs.key,
        "etcdctl held with the key it queued"
    );
    assert!(theirs.create_revision > queue[0].create_revision);
    assert!(
        keys_under(&etcd, &prefix).is_empty(),
        "both unlocked: no key left"
    );
}

/// While `etcdctl lock <path>` holds (no command: it holds until signalled), zklock's
/// `try_lock` is `None` and `lock_timeout` times out; a zklock waiter queued behind it gets the
/// lock promptly once etcdctl unlocks on SIGTERM, with a token above etcdctl's key's create
/// revision.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcdctl_holder_excludes_zklock_until_it_unlocks_on_sigterm() {
    let etcd = etcd();
    let m = manager(&etcd).await;
    let key = "interop/report";
    let path = m.path_of(key).unwrap();
    let prefix = format!("{path}/");

    let mut etcdctl = Etcdctl::spawn(&etcd, &["lock", &path]);
    let held_key = etcdctl.expect_line().await;
    assert!(held_key.starts_with(&prefix), "{held_key}");
    let theirs = until_keys(&etcd, &prefix, 1).await.remove(0);
    assert_eq!(theirs.key, held_key);

    assert!(
        m.try_lock(key).await.unwrap().is_none(),
        "zklock took a lock etcdctl holds"
    );
    match m.lock_timeout(key, Duration::from_millis(400)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected a timeout while etcdctl holds, got {other:?}"),
    }
    // Neither left a key behind: etcdctl's is the only one.
    m.flush().await;
    assert_eq!(keys_under(&etcd, &prefix), vec![theirs.clone()]);

    let waiter = tokio::spawn({
        let m = m.clone();
        async move {
            let g = m.lock(key).await.unwrap();
            (now_epoch_ms(), g)
        }
    });
    until_keys(&etcd, &prefix, 2).await;
    tokio::time::sleep(STILL_WAITS).await;
    assert!(!waiter.is_finished(), "zklock got a lock etcdctl holds");

    let unlocked_at = now_epoch_ms();
    etcdctl.signal("TERM");
    let (got_at, guard) = tokio::time::timeout(PROMPTLY, waiter)
        .await
        .expect("zklock got the lock after etcdctl unlocked")
        .unwrap();
    assert!(got_at >= unlocked_at);
    // An unlock, not the session's end: well within etcdctl's 10 s session TTL.
    assert!(
        got_at - unlocked_at < 5_000,
        "took {} ms",
        got_at - unlocked_at
    );
    assert!(
        guard.fencing_token().grant() > theirs.create_revision,
        "zklock's token {} must be above etcdctl's key's create revision {}",
        guard.fencing_token(),
        theirs.create_revision
    );
    let status = etcdctl.exit().await;
    assert!(
        status.success(),
        "etcdctl unlocks and exits 0 on SIGTERM: {status}"
    );
    let left = keys_under(&etcd, &prefix);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].create_revision, guard.fencing_token().grant());
}

/// `etcdctl lock --ttl=2 <path>` killed with SIGKILL never unlocks: its key stays until etcd
/// ends its session's lease, and only then does the zklock waiter behind it get the lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcdctl_holder_killed_with_sigkill_is_freed_only_by_its_lease_ttl() {
    let etcd = etcd();
    let m = manager(&etcd).await;
    let key = "interop/crash";
    let path = m.path_of(key).unwrap();
    let prefix = format!("{path}/");

    let mut etcdctl = Etcdctl::spawn(&etcd, &["lock", "--ttl=2", &path]);
    let held_key = etcdctl.expect_line().await;
    let theirs = until_keys(&etcd, &prefix, 1).await.remove(0);
    assert_eq!(theirs.key, held_key);
    let (_, granted) = lease_ttl(&etcd, theirs.lease);
    assert_eq!(granted, 2, "etcdctl's session TTL");

    let waiter = tokio::spawn({
        let m = m.clone();
        async move {
            let g = m.lock(key).await.unwrap();
            (tokio::time::Instant::now(), g)
        }
    });
    until_keys(&etcd, &prefix, 2).await;

    etcdctl.signal("KILL");
    let killed = tokio::time::Instant::now();
    let status = etcdctl.exit().await;
    assert!(!status.success(), "killed: {status}");
    // Nobody unlocked: the key is still there, and the waiter still waits.
    assert_eq!(keys_under(&etcd, &prefix)[0], theirs);
    assert!(
        !waiter.is_finished(),
        "zklock got the lock of a killed holder at once"
    );

    let (got, guard) = tokio::time::timeout(PROMPTLY, waiter)
        .await
        .expect("zklock got the lock once etcdctl's lease ended")
        .unwrap();
    let after = got - killed;
    // The lease was last renewed at most TTL/3 before the kill, and etcd checks for expired
    // leases every 500 ms.
    assert!(
        after >= Duration::from_millis(1000) && after < Duration::from_secs(5),
        "zklock got the lock {after:?} after the kill: expected about the 2 s TTL"
    );
    assert_eq!(
        lease_ttl(&etcd, theirs.lease).0,
        -1,
        "etcdctl's lease ended"
    );
    assert!(guard.fencing_token().grant() > theirs.create_revision);
}

/// One queue across tools, in create-revision order: zklock holds, `etcdctl lock` queues,
/// then a second zklock manager; on release etcdctl gets the lock first (its command runs and
/// ends) and only then the second manager.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_queue_is_fifo_across_zklock_and_etcdctl() {
    let etcd = etcd();
    let (a, b) = (manager(&etcd).await, manager(&etcd).await);
    let key = "interop/queue";
    let path = a.path_of(key).unwrap();
    let prefix = format!("{path}/");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("log");

    let first = a.lock(key).await.unwrap();
    let script = format!(
        "echo start $(date +%s%N) >> {0}; sleep 0.3; echo end $(date +%s%N) >> {0}",
        log.display()
    );
    let mut etcdctl = Etcdctl::spawn(&etcd, &["lock", &path, "--", "sh", "-c", &script]);
    until_keys(&etcd, &prefix, 2).await;
    let third = tokio::spawn(async move {
        let g = b.lock(key).await.unwrap();
        let at = now_epoch_ms();
        let token = g.fencing_token();
        g.release().await.unwrap();
        (at, token)
    });
    let queue = until_keys(&etcd, &prefix, 3).await;
    tokio::time::sleep(STILL_WAITS).await;
    assert!(!log.exists(), "etcdctl ran while zklock held");
    assert!(
        !third.is_finished(),
        "the second manager got in while zklock held"
    );

    let released_at = now_epoch_ms();
    first.release().await.unwrap();
    let status = etcdctl.exit().await;
    assert!(status.success(), "etcdctl lock: {status}");
    let (third_at, third_token) = tokio::time::timeout(PROMPTLY, third)
        .await
        .expect("the second manager got the lock after etcdctl")
        .unwrap();

    let text = std::fs::read_to_string(&log).unwrap();
    let times: Vec<(&str, u64)> = text
        .lines()
        .map(|l| {
            let (what, ns) = l.split_once(' ').unwrap();
            (what, ms_of_ns(ns))
        })
        .collect();
    assert_eq!(
        times.iter().map(|t| t.0).collect::<Vec<_>>(),
        ["start", "end"],
        "{text}"
    );
    assert!(
        times[0].1 >= released_at,
        "etcdctl started at {} ms, before zklock released at {released_at} ms",
        times[0].1
    );
    assert!(
        third_at >= times[1].1,
        "the second manager got the lock at {third_at} ms, while etcdctl's command ran until {} ms",
        times[1].1
    );
    // Tokens follow the queue: each holder's key was created after the one before.
    assert_eq!(queue[2].create_revision, third_token.grant());
    assert!(queue[0].create_revision < queue[1].create_revision);
    assert!(queue[1].create_revision < third_token.grant());
}

/// A waiter that leaves the queue hands the lock to nobody: zklock holds, `etcdctl lock`
/// queues, a second manager queues behind etcdctl and watches its key; etcdctl gives up on
/// SIGTERM (deleting its key), and the second manager still waits for the holder, then gets
/// the lock once it releases.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcdctl_waiter_that_gives_up_hands_the_lock_to_nobody() {
    let etcd = etcd();
    let (a, b) = (manager(&etcd).await, manager(&etcd).await);
    let key = "interop/leave";
    let path = a.path_of(key).unwrap();
    let prefix = format!("{path}/");
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");

    let first = a.lock(key).await.unwrap();
    let mut etcdctl = Etcdctl::spawn(
        &etcd,
        &["lock", &path, "--", "touch", ran.to_str().unwrap()],
    );
    until_keys(&etcd, &prefix, 2).await;
    let waiter = tokio::spawn(async move {
        let g = b.lock(key).await.unwrap();
        (now_epoch_ms(), g)
    });
    let queue = until_keys(&etcd, &prefix, 3).await;

    etcdctl.signal("TERM");
    etcdctl.exit().await;
    assert!(!ran.exists(), "etcdctl ran its command without the lock");
    let left = until_keys(&etcd, &prefix, 2).await;
    assert_eq!(left, [queue[0].clone(), queue[2].clone()]);
    tokio::time::sleep(STILL_WAITS).await;
    assert!(
        !waiter.is_finished(),
        "the second manager got the lock zklock still holds when etcdctl left the queue"
    );
    assert!(first.is_held());

    let released_at = now_epoch_ms();
    first.release().await.unwrap();
    let (got_at, second) = tokio::time::timeout(PROMPTLY, waiter)
        .await
        .expect("the second manager got the lock after the release")
        .unwrap();
    assert!(got_at >= released_at);
    assert_eq!(second.fencing_token().grant(), queue[2].create_revision);
}

/// `etcdctl lease revoke` of the holder's lease (what zklock's `revoke` refusal on etcd points
/// operators to) deletes zklock's key: `etcdctl lock` waiting behind it gets in, the zklock
/// guard reports its hold lost, and the manager goes on with a new lease.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcdctl_lease_revoke_of_the_holder_hands_the_lock_on_and_zklock_reports_the_loss() {
    let etcd = etcd();
    let m = manager(&etcd).await;
    let key = "interop/revoked";
    let path = m.path_of(key).unwrap();
    let prefix = format!("{path}/");
    let dir = tempfile::tempdir().unwrap();
    let ran = dir.path().join("ran");

    let guard = m.lock(key).await.unwrap();
    let script = format!("date +%s%N > {0}.tmp; mv {0}.tmp {0}", ran.display());
    let mut etcdctl = Etcdctl::spawn(&etcd, &["lock", &path, "--", "sh", "-c", &script]);
    let queue = until_keys(&etcd, &prefix, 2).await;
    let ours = queue[0].clone();
    assert_eq!(ours.create_revision, guard.fencing_token().grant());

    ctl(&etcd, &["lease", "revoke", &format!("{:x}", ours.lease)]);
    let reason = tokio::time::timeout(PROMPTLY, guard.lost())
        .await
        .expect("zklock reported the revoked hold lost");
    assert!(
        matches!(reason, LossReason::NodeDeleted | LossReason::SessionExpired),
        "{reason:?}"
    );
    assert!(!guard.is_held());
    let status = etcdctl.exit().await;
    assert!(status.success(), "etcdctl lock: {status}");
    assert!(
        ran.exists(),
        "etcdctl ran its command once the holder's lease was revoked"
    );
    drop(guard);

    // The manager goes on, on a new lease, with a token above etcdctl's.
    let again = m.lock_timeout(key, PROMPTLY).await.unwrap();
    let now = until_keys(&etcd, &prefix, 1).await.remove(0);
    assert_ne!(now.lease, ours.lease);
    assert_eq!(now.key, format!("{path}/{:x}", now.lease));
    assert!(again.fencing_token().grant() > queue[1].create_revision);
}

/// Elections both ways. A zklock leader latch leads: `etcdctl elect -l` shows its participant
/// id as the leader's proposal, `etcdctl elect <path> <proposal>` does not lead while it does,
/// and leads once the latch leaves. Then etcdctl leads: another zklock latch neither `try_lead`s
/// nor leads within a timeout, and leads once etcdctl resigns on SIGINT. The observer saw the
/// leaders one at a time, in that order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zklock_leader_latches_and_etcdctl_elect_elect_one_leader() {
    let etcd = etcd();
    let m = manager(&etcd).await;
    let latch = m.leader_latch("scheduler", "zk-1").unwrap();
    let path = latch.path().to_string();
    let prefix = format!("{path}/");

    let leadership = latch.lead().await.unwrap();
    let ours = until_keys(&etcd, &prefix, 1).await.remove(0);
    assert_eq!(
        ours.value, "zk-1",
        "the latch's proposal is its participant id"
    );

    let mut observer = Etcdctl::spawn(&etcd, &["elect", "-l", &path]);
    assert_eq!(observer.expect_line().await, ours.key);
    assert_eq!(observer.expect_line().await, "zk-1");

    // etcdctl campaigns: it does not lead while the latch does.
    let mut candidate = Etcdctl::spawn(&etcd, &["elect", &path, "etcd-1"]);
    let queue = until_keys(&etcd, &prefix, 2).await;
    let theirs = queue[1].clone();
    assert_eq!(theirs.value, "etcd-1");
    let (said, seen) = tokio::join!(candidate.line(STILL_WAITS), observer.line(STILL_WAITS));
    assert_eq!(said, None, "etcdctl elect led while zklock did");
    assert_eq!(seen, None, "the leader changed while zklock led");
    assert!(leadership.is_leader());

    let left_at = now_epoch_ms();
    leadership.leave().await.unwrap();
    assert_eq!(candidate.expect_line().await, theirs.key);
    assert_eq!(candidate.expect_line().await, "etcd-1");
    let etcdctl_led_at = now_epoch_ms();
    assert!(etcdctl_led_at >= left_at);
    assert_eq!(observer.expect_line().await, theirs.key);
    assert_eq!(observer.expect_line().await, "etcd-1");

    // etcdctl leads: another zklock participant does not.
    let latch2 = m.leader_latch("scheduler", "zk-2").unwrap();
    assert!(
        latch2.try_lead().await.unwrap().is_none(),
        "zklock led while etcdctl did"
    );
    match latch2.lead_timeout(Duration::from_millis(400)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("expected a timeout while etcdctl leads, got {other:?}"),
    }
    let waiting = tokio::spawn(async move {
        let l = latch2.lead().await.unwrap();
        (now_epoch_ms(), l)
    });
    until_keys(&etcd, &prefix, 2).await;
    let seen = observer.line(STILL_WAITS).await;
    assert_eq!(seen, None, "the leader changed while etcdctl led");
    assert!(!waiting.is_finished(), "zklock led while etcdctl did");

    let resigned_at = now_epoch_ms();
    candidate.signal("INT");
    let (zk2_led_at, leadership2) = tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("zklock led after etcdctl resigned")
        .unwrap();
    assert!(zk2_led_at >= resigned_at);
    assert!(
        zk2_led_at - resigned_at < 5_000,
        "a resign, not etcdctl's 60 s session: {} ms",
        zk2_led_at - resigned_at
    );
    let status = candidate.exit().await;
    assert!(
        status.success(),
        "etcdctl elect resigns and exits 0: {status}"
    );
    assert!(leadership2.is_leader());
    assert!(leadership2.epoch().grant() > theirs.create_revision);
    let now = until_keys(&etcd, &prefix, 1).await.remove(0);
    assert_eq!(now.value, "zk-2");
    assert_eq!(observer.expect_line().await, now.key);
    assert_eq!(observer.expect_line().await, "zk-2");

    leadership2.leave().await.unwrap();
    observer.signal("INT");
    observer.exit().await;
}

/// The holder's key is exactly `<path>/<lease id in hex>`, on the lease etcd lists for the
/// manager, with the create revision as the fencing token: what `concurrency.Mutex` writes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_holder_key_is_the_path_slash_the_lease_id_in_hex() {
    let etcd = etcd();
    let m = manager(&etcd).await;
    let path = m.path_of("interop/layout").unwrap();

    // The manager's lease is the only one. etcdctl lists it in 16 hex digits (`%016x`); the
    // key names it as Go's `concurrency.Mutex` does (`%x`, no leading zeros).
    let leases = ctl(&etcd, &["lease", "list"]);
    let lines: Vec<&str> = leases.lines().collect();
    assert_eq!(lines.first(), Some(&"found 1 leases"), "{leases}");
    let lease = i64::from_str_radix(lines[1].trim(), 16).unwrap();
    let lease_hex = format!("{lease:x}");

    let guard = m.lock("interop/layout").await.unwrap();
    let listed = ctl(
        &etcd,
        &["get", "--prefix", &format!("{path}/"), "--keys-only"],
    );
    let keys: Vec<&str> = listed.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(keys, [format!("{path}/{lease_hex}")], "{listed}");

    let entry = keys_under(&etcd, &format!("{path}/")).remove(0);
    assert_eq!(entry.lease, lease);
    assert_eq!(entry.create_revision, guard.fencing_token().grant());
    assert_eq!(guard.node_path(), entry.key);
    // etcd attaches exactly that key to the manager's lease, of the manager's TTL.
    let ttl = ctl(&etcd, &["lease", "timetolive", &lease_hex, "--keys"]);
    assert!(
        ttl.contains(&format!("attached keys([{}])", entry.key)),
        "{ttl}"
    );
    assert_eq!(lease_ttl(&etcd, entry.lease).1, LEASE.as_secs() as i64);

    guard.release().await.unwrap();
    m.flush().await;
    assert!(keys_under(&etcd, &format!("{path}/")).is_empty());
}
