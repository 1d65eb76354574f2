//! The adversary made systematic on etcd: every protocol — mutex acquire and release, the
//! hand-over to a waiter of another process (the victim's key queued behind the other's, its
//! watch on the other's deletion), the same wait abandoned at its deadline, read and write locks
//! (etcd's `read/` and `write/` keys), a semaphore lease, a job's claim with its `at_least`
//! window (the run record on a lease of its own), a leader's election (`concurrency.Election`),
//! and the mutex and the hand-over of a victim without fencing tokens — run once per request
//! boundary k, cut there, and judged by the history checker.
//!
//! A victim process (a manager whose connection goes through a [`Relay`]) runs the protocol:
//! take, hold a moment (stopping at once when told the hold is lost), release. etcd speaks gRPC
//! over HTTP/2, and a manager's requests, watches and lease keep-alives all share one HTTP/2
//! connection: the relay's "requests" are the chunks the client writes on it (HEADERS and DATA
//! frames, PINGs, WINDOW_UPDATEs), so k runs over every point at which the client wrote
//! something. The relay lets the server receive the k-th chunk and withholds every answer after
//! it, then
//! - `Reset`: resets the connection: every stream on it at once (the acquire's transaction or
//!   watch, the lease's keep-alive stream, a hold's watch); the client reconnects at once;
//! - `Cancel`: resets it and cuts the victim off, and the victim's future is dropped while it
//!   waits (a dropped acquire deletes its key in the background once the answers of its puts came
//!   back); the network comes back after;
//! - `Kill`: cuts the victim off for good without a reset, as a partition or a dead host: etcd
//!   hears no keep-alive, and only the end of the victim's lease (2 s) deletes its keys. The
//!   victim lives on, cut off, and holds until it is told its hold is lost (its lease's deadline
//!   passed without a confirmed keep-alive), while the other process waits; then it is killed.
//!
//! Then another process (connected directly) takes the same lock. The checker decides: no two
//! believed holders at any moment (a hold counts from its grant to its release or its reported
//! loss), tokens (create revisions) strictly increasing in grant order; nothing stuck (the other
//! process gets the lock within the lease of the cut, and no contender key of the lock is left
//! under `P/` once everyone let go or the lease ran out, read with a plain `etcd_client` get
//! `--prefix`; after `Kill`, no key of the victim is left anywhere); a job's window (its run
//! record and that record's lease) never shrinks, and at most one body runs within it.
//!
//! Every run is judged. (The first sweep found that a `Cancel` dropping the victim's release
//! before its delete was answered left its key on the live lease: the release now deletes from
//! a task of its own.)
//!
//! k runs over every chunk the protocol writes (counted on an uncut run; the lease's keep-alives
//! and the HTTP/2 pings every third of the lease count too, so a boundary moves by one now and
//! then). In CI each k gets one kind of cut, rotating, and the last k also `Kill`;
//! `ZKLOCK_CUTS=all cargo test --test cuts -- cut_every_request_etcd::` runs every kind at every k.

use crate::cuts;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use cuts::{sweep_through_relay, LeaseServer, Protocol};
use etcd_client::{Client, GetOptions, KeyValue};
use zklock::LockManager;
use zklock_testkit::EtcdServer;

/// The lock path of `key` in `protocol` (its contenders' keys are under `<path>/`).
fn lock_path(m: &LockManager, protocol: Protocol, key: &str) -> String {
    match protocol {
        Protocol::Read | Protocol::Write => m.rwlock(key).unwrap().path().to_string(),
        Protocol::Leader => m.leader_latch(key, "look").unwrap().path().to_string(),
        Protocol::Semaphore => m.semaphore(key, 1).unwrap().path().to_string(),
        _ => m.path_of(key).unwrap(),
    }
}

/// A key-value as a report shows it: key, lease (hex), create revision, value.
fn show(kv: &KeyValue) -> String {
    format!(
        "{} (lease {:x}, created at {}): {}",
        kv.key_str().unwrap_or("?"),
        kv.lease(),
        kv.create_revision(),
        kv.value_str().unwrap_or("?")
    )
}

/// The field `name=` of a key's value (`zklock host=<host> pid=<pid> at=<ms> id=<identity>`).
fn field<'a>(value: &'a str, name: &str) -> Option<&'a str> {
    value
        .split_whitespace()
        .find_map(|w| w.strip_prefix(name)?.strip_prefix('='))
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// The test kit's etcd, and a plain client to look at it.
struct Etcd {
    server: EtcdServer,
    admin: Client,
    /// The run record seen last per job path: its create revision and its window's end (ms).
    records: Mutex<HashMap<String, (i64, i64)>>,
}

impl Etcd {
    /// The key-values under `prefix`, in create order.
    async fn under(&self, prefix: &str) -> Vec<KeyValue> {
        let options = GetOptions::new().with_prefix().with_sort(
            etcd_client::SortTarget::Create,
            etcd_client::SortOrder::Ascend,
        );
        let mut got = self
            .admin
            .clone()
            .get(prefix, Some(options))
            .await
            .expect("read the test etcd");
        got.take_kvs()
    }
}

impl LeaseServer for Etcd {
    /// The victim's etcd lease (etcd's shortest with its default election timeout), and the
    /// other's: a victim cut off for good is let go of within it.
    const LEASE: Duration = Duration::from_secs(2);

    fn url(&self) -> String {
        self.server.url()
    }

    fn addr(&self) -> String {
        self.server.endpoint()
    }

    fn lock_path(&self, m: &LockManager, protocol: Protocol, key: &str) -> String {
        lock_path(m, protocol, key)
    }

    /// A second contender's key is under the lock's prefix: the victim's, queued behind the
    /// first holder's.
    async fn waiting(&self, path: &str) -> bool {
        self.under(&format!("{path}/")).await.len() >= 2
    }

    /// The end of the job's window (ms since the epoch): when its run record's lease runs out,
    /// counted from the claim's time (`at=` in the record) and the lease's granted TTL. The
    /// window never shrinks: the record, once seen, stays the same key (its create revision)
    /// until its window has passed, and its lease is live.
    async fn window(&self, path: &str) -> Option<i64> {
        let record = format!("{path}%RUN");
        let mut got = self
            .admin
            .clone()
            .get(record.as_str(), None)
            .await
            .expect("read the test etcd");
        let kv = got.take_kvs().into_iter().next();
        let Some(kv) = kv else {
            let seen = self.records.lock().unwrap().get(path).copied();
            if let Some((rev, end)) = seen {
                assert!(
                    now_ms() >= end,
                    "the run record of {path} (created at {rev}) is gone {} ms before its window ends",
                    end - now_ms()
                );
            }
            return None;
        };
        let value = kv.value_str().unwrap().to_string();
        let at: i64 = field(&value, "at")
            .and_then(|at| at.parse().ok())
            .unwrap_or_else(|| panic!("no claim time in the run record {}", show(&kv)));
        let ttl = self
            .admin
            .clone()
            .lease_time_to_live(kv.lease(), None)
            .await
            .expect("ask etcd for the record's lease");
        assert!(
            ttl.ttl() > 0,
            "the run record {} is on a lease that ended ({}s left of {}s)",
            show(&kv),
            ttl.ttl(),
            ttl.granted_ttl()
        );
        assert!(
            ttl.granted_ttl() >= cuts::WINDOW.as_secs() as i64,
            "the run record {} is on a lease of {}s, shorter than the job's at_least of {:?}",
            show(&kv),
            ttl.granted_ttl(),
            cuts::WINDOW
        );
        let end = at + ttl.granted_ttl() * 1000;
        let mut records = self.records.lock().unwrap();
        if let Some(&(rev, old_end)) = records.get(path) {
            assert!(
                rev == kv.create_revision() || now_ms() >= old_end,
                "the run record of {path} (created at {rev}) was replaced by {} {} ms before its \
                 window ended",
                show(&kv),
                old_end - now_ms()
            );
        }
        records.insert(path.to_string(), (kv.create_revision(), end));
        Some(end)
    }

    /// Every contender key of the lock (`P/<lease>`, `P/<lease>_<n>`, `P/read/<n>`,
    /// `P/write/<n>`).
    async fn left(&self, path: &str) -> Vec<String> {
        self.under(&format!("{path}/"))
            .await
            .iter()
            .map(show)
            .collect()
    }

    /// etcd keeps no session but a lease: every key of the process named `identity` (its
    /// values name it), anywhere, but a job's run record (which its own lease keeps for the
    /// job's window, by design).
    async fn sessions_left(&self, identity: &str) -> Vec<String> {
        let id = format!("id={identity}");
        let options = GetOptions::new().with_all_keys();
        let mut got = self
            .admin
            .clone()
            .get("", Some(options))
            .await
            .expect("read the test etcd");
        got.take_kvs()
            .iter()
            .filter(|kv| !kv.key_str().unwrap_or("").ends_with("%RUN"))
            .filter(|kv| {
                kv.value_str()
                    .unwrap_or("")
                    .split_whitespace()
                    .any(|w| w == id)
            })
            .map(show)
            .collect()
    }
}

/// Sweeps `protocol` on a server of its own.
async fn sweep_etcd(protocol: Protocol, offset: usize) {
    let server = EtcdServer::start().expect("start etcd (see the test kit's error)");
    let admin = Client::connect([server.client_url()], None)
        .await
        .expect("connect to the test etcd");
    let etcd = Etcd {
        server,
        admin,
        records: Mutex::default(),
    };
    sweep_through_relay(&etcd, protocol, offset).await;
}

cuts::sweep_tests!(sweep_etcd {
    mutex_cut_at_every_request: Mutex, 0;
    handover_cut_at_every_request: Handover, 1;
    abandoned_wait_cut_at_every_request: Abandon, 0;
    read_lock_cut_at_every_request: Read, 2;
    write_lock_cut_at_every_request: Write, 0;
    semaphore_cut_at_every_request: Semaphore, 2;
    job_cut_at_every_request: Job, 1;
    leader_cut_at_every_request: Leader, 2;
    untokened_mutex_cut_at_every_request: Untokened, 1;
    untokened_handover_cut_at_every_request: UntokenedHandover, 2;
});
