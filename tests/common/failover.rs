//! Shared by the Redis Sentinel and Redis Cluster fault tests (with `common/faults.rs` beside
//! it as `faults`): the contended load, the recorded holds, the checks of the history across a
//! fault, and the split brain's fenced writers (the old holder writing while it believes it
//! holds, the new one writing once granted) with what is measured and asserted of them.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use zklock::fence::{Fence, Outcome, RedisFence, RedisWrite};
use zklock::{FencingToken, LockGuard, LockManager, LossReason};
use zklock_testkit::{now_ns, History, HoldEnd, HoldSpan, Recorder, RedisServer, Report};

pub use crate::faults::{hold, release};
use crate::faults::{mutex_worker, rw_worker, Crew, Work};

/// The pace of the contending workers.
pub fn work() -> Work {
    Work {
        wait: Duration::from_secs(20),
        hold: Duration::from_millis(30),
        think: Duration::from_millis(10),
    }
}

/// Contending workers recorded in one history: mutex workers of each named manager on every
/// key (and, with `rw`, a read/write worker on `shelf`), recorded as `<name>/<key>` (and
/// `<name>/rw`).
pub struct Contention {
    pub history: History,
    pub crew: Crew,
    tasks: Vec<JoinHandle<()>>,
}

impl Contention {
    /// Starts the workers in a new history.
    pub fn start(managers: &[(String, LockManager)], keys: &[String], rw: bool) -> Contention {
        let history = History::new();
        let crew = Crew::new();
        let mut tasks = Vec::new();
        for (name, m) in managers {
            for key in keys {
                tasks.push(tokio::spawn(mutex_worker(
                    m.clone(),
                    key.clone(),
                    history.recorder(&format!("{name}/{key}")),
                    crew.clone(),
                    work(),
                )));
            }
            if rw {
                tasks.push(tokio::spawn(rw_worker(
                    m.clone(),
                    "shelf".into(),
                    history.recorder(&format!("{name}/rw")),
                    crew.clone(),
                    work(),
                    3,
                )));
            }
        }
        Contention {
            history,
            crew,
            tasks,
        }
    }

    /// Adds mutex workers of each named manager on every key, at the pace `work` (recorded as
    /// `<name>/<tag>/<key>`): with a short `wait`, workers whose acquires keep timing out.
    pub fn add(
        &mut self,
        managers: &[(String, LockManager)],
        keys: &[String],
        tag: &str,
        work: Work,
    ) {
        for (name, m) in managers {
            for key in keys {
                self.tasks.push(tokio::spawn(mutex_worker(
                    m.clone(),
                    key.clone(),
                    self.history.recorder(&format!("{name}/{tag}/{key}")),
                    self.crew.clone(),
                    work,
                )));
            }
        }
    }

    /// Waits until the workers are granted `more` times after the grants so far, within
    /// `within`.
    pub async fn until_more_grants(&self, more: u64, within: Duration) {
        let since = self.crew.grants();
        self.crew.until_grants(since, more, within).await;
    }

    /// Stops the workers and waits for them (none may have panicked); the history back.
    pub async fn stop(self) -> History {
        self.crew.stop();
        for t in self.tasks {
            tokio::time::timeout(Duration::from_secs(60), t)
                .await
                .expect("workers stop")
                .expect("a worker panicked");
        }
        self.history
    }
}

/// A hold kept until it is reported lost: the loss is recorded, then the release (which must
/// say the hold was lost). Answers the reason.
pub fn kept_until_lost(guard: LockGuard, key: String, rec: Recorder) -> JoinHandle<LossReason> {
    tokio::spawn(async move {
        let reason = guard.lost().await;
        rec.lost(&key, reason);
        assert!(
            release(guard, &key, &rec).await.is_err(),
            "releasing a lost hold says so"
        );
        reason
    })
}

/// The history checked with nothing excused: no two believed holders of a key at any moment,
/// tokens increasing in grant order, no overlap excused by a silent fault.
pub fn checked(history: &History) -> Report {
    let report = history.check();
    report.assert_ok();
    assert!(report.unprotected.is_empty(), "{report}");
    report
}

/// Every key's holds, from the report.
pub fn holds_by_key(report: &Report) -> BTreeMap<&str, Vec<&HoldSpan>> {
    let mut by_key: BTreeMap<&str, Vec<_>> = BTreeMap::new();
    for h in &report.holds {
        by_key.entry(h.key.as_str()).or_default().push(h);
    }
    by_key
}

/// Every grant of a key asked for after `fault_ns` has a token above every token of that key
/// granted before (the checker compares neighbours; this says it across the fault in one
/// line). Answers the keys granted on both sides.
///
/// "After" is by the acquire's call, not by when its grant was reported: a grant the old
/// server made just before the fault may reach its client after it, and beside a read hold
/// granted a moment later (readers share) its token is lower, rightly. A call made after the
/// fault can only be answered by what serves after it.
pub fn assert_tokens_above_across(report: &Report, fault_ns: u64) -> Vec<String> {
    let mut keys = Vec::new();
    for (key, holds) in holds_by_key(report) {
        let before = holds
            .iter()
            .filter(|h| h.start_ns < fault_ns)
            .map(|h| h.token)
            .max();
        let after = holds
            .iter()
            .filter(|h| h.invoked_ns > fault_ns)
            .map(|h| h.token)
            .min();
        if let (Some(before), Some(after)) = (before, after) {
            keys.push(key.to_string());
            assert!(
                after > before,
                "{key}: a grant after the fault has token {after}, not above {before} granted \
                 before:\n{report}"
            );
        }
    }
    keys
}

/// The holds going on at `fault_ns` that ended by a loss, each reason counted.
pub fn losses_across(report: &Report, fault_ns: u64) -> BTreeMap<String, usize> {
    let mut lost = BTreeMap::new();
    for h in &report.holds {
        if h.start_ns < fault_ns && h.end_ns.is_some_and(|e| e > fault_ns) {
            if let HoldEnd::Lost(reason) = &h.end {
                *lost.entry(reason_name(reason)).or_default() += 1;
            }
        }
    }
    lost
}

/// Every hold going on at `fault_ns` that ended by a loss was lost for one of `allowed`;
/// answers [`losses_across`].
pub fn assert_losses_across_among(
    report: &Report,
    fault_ns: u64,
    allowed: &[LossReason],
) -> BTreeMap<String, usize> {
    let lost = losses_across(report, fault_ns);
    let names: Vec<String> = allowed.iter().map(|r| format!("{r:?}")).collect();
    for reason in lost.keys() {
        assert!(
            names.contains(reason),
            "holds lost across the fault: {lost:?}; only {names:?} allowed"
        );
    }
    lost
}

/// The name of the loss reason whose text is `text` (as the history records it).
pub fn reason_name(text: &str) -> String {
    [
        LossReason::SessionExpired,
        LossReason::Disconnected,
        LossReason::NodeDeleted,
        LossReason::LeaseExpired,
        LossReason::Revoked,
        LossReason::Closed,
        LossReason::HoldLimit,
        LossReason::Failover,
    ]
    .into_iter()
    .find(|r| r.to_string() == text)
    .map_or_else(|| text.to_string(), |r| format!("{r:?}"))
}

/// The resource the split-brain holders write through the fence.
pub const RESOURCE: &str = "stock:sku_7";

/// A plain Redis of its own for the fence (it survives the lock store's failovers), and the
/// fence on it.
pub async fn fence_store() -> (RedisServer, RedisFence) {
    let store = tokio::task::block_in_place(RedisServer::start).expect("start the fence's Redis");
    let fence = RedisFence::new(
        redis::Client::open(store.url())
            .unwrap()
            .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
            .await
            .unwrap(),
    );
    (store, fence)
}

/// One fenced write: when it was sent and answered, and whether it was accepted.
#[derive(Debug, Clone, Copy)]
pub struct Wrote {
    pub sent_ns: u64,
    pub answered_ns: u64,
    pub accepted: bool,
}

/// Writes `value` to [`RESOURCE`] through the fence with `token`.
pub async fn fenced_set(fence: &RedisFence, token: FencingToken, value: String) -> Wrote {
    let sent_ns = now_ns();
    let outcome = fence
        .fenced_write(RESOURCE, token, RedisWrite::set(RESOURCE, value))
        .await
        .expect("the fence's store answers");
    Wrote {
        sent_ns,
        answered_ns: now_ns(),
        accepted: matches!(outcome, Outcome::Accepted(_)),
    }
}

/// The old holder of a split brain, writing through the fence (see [`writer_until_lost`]).
pub struct OldHolder {
    pub token: FencingToken,
    writer: JoinHandle<(LossReason, u64, Vec<Wrote>)>,
}

/// A holder that writes through the fence every 20 ms while it believes it holds
/// (`is_held()`), until told of its loss; its task answers the loss, when it was told, and its
/// writes.
pub fn writer_until_lost(
    guard: LockGuard,
    key: String,
    rec: Recorder,
    fence: RedisFence,
) -> OldHolder {
    let token = guard.fencing_token();
    let writer = tokio::spawn(async move {
        let mut writes = Vec::new();
        let reason = loop {
            tokio::select! {
                biased;
                reason = guard.lost() => break reason,
                _ = tokio::time::sleep(Duration::from_millis(20)) => {}
            }
            if guard.is_held() {
                let n = writes.len();
                writes.push(fenced_set(&fence, token, format!("old holder {n}")).await);
            }
        };
        rec.lost(&key, reason);
        let told_ns = now_ns();
        assert!(release(guard, &key, &rec).await.is_err());
        (reason, told_ns, writes)
    });
    OldHolder { token, writer }
}

/// The new holder of a split brain, granted, with its first write through the fence.
pub struct NewHolder {
    pub guard: LockGuard,
    pub key: String,
    pub rec: Recorder,
    /// When it was granted.
    pub granted: Instant,
    pub first: Wrote,
}

/// The new holder of a split brain: `m` locks `key` for `rec` within `within` and writes
/// through the fence at once.
pub fn new_holder_writes(
    m: LockManager,
    key: String,
    rec: Recorder,
    fence: RedisFence,
    within: Duration,
) -> JoinHandle<NewHolder> {
    tokio::spawn(async move {
        let guard = hold(&m, &key, &rec, within).await;
        let granted = Instant::now();
        let first = fenced_set(&fence, guard.fencing_token(), "B".into()).await;
        NewHolder {
            guard,
            key,
            rec,
            granted,
            first,
        }
    })
}

/// What the old holder A and the new holder B of `key` did in a split brain, its end included:
/// A told of its loss, a late write with A's token (as a holder that did not notice its loss,
/// paused or on the old primary's side of a partition, would make), B's second write, B's
/// release (its hold lived) and the fence's last token.
pub struct SplitBrain {
    pub key: String,
    pub token_a: FencingToken,
    pub reason_a: LossReason,
    pub told_a_ns: u64,
    pub writes_a: Vec<Wrote>,
    pub late_a: Wrote,
    pub token_b: FencingToken,
    pub first_b: Wrote,
    pub second_b: Wrote,
    pub last: Option<FencingToken>,
}

/// What a split brain's history shows of it.
pub struct Measured {
    /// The overlap of the believed holds of the key (unprotected by the checker's reckoning).
    pub overlap_ns: u64,
    /// When B was granted.
    pub b_granted_ns: u64,
    /// A's writes sent once B was granted.
    pub in_overlap: usize,
    /// A's writes sent once B's first write was answered.
    pub after_b: usize,
    /// Whether every one of those was refused.
    pub after_b_refused: bool,
}

impl SplitBrain {
    /// Waits (within `within`) for A to be told of its loss, then makes A's late write, B's
    /// second write and B's release.
    pub async fn end(a: OldHolder, b: NewHolder, fence: &RedisFence, within: Duration) -> Self {
        let token_b = b.guard.fencing_token();
        let (reason_a, told_a_ns, writes_a) = tokio::time::timeout(within, a.writer)
            .await
            .expect("A is told of its loss")
            .unwrap();
        let late_a = fenced_set(fence, a.token, "A, late".into()).await;
        let second_b = fenced_set(fence, token_b, "B again".into()).await;
        release(b.guard, &b.key, &b.rec)
            .await
            .expect("B's hold lived");
        let last = fence.last_token(RESOURCE).await.unwrap();
        SplitBrain {
            key: b.key,
            token_a: a.token,
            reason_a,
            told_a_ns,
            writes_a,
            late_a,
            token_b,
            first_b: b.first,
            second_b,
            last,
        }
    }

    /// What was measured, for the test's report line: the overlap, when A was told, A's
    /// writes, the tokens.
    pub fn describe(&self, measured: &Measured, lease: Duration) -> String {
        format!(
            "MEASURED OVERLAP of believed holds {:.1} ms (lease {lease:?}); A told {:?} {:.1} ms \
             after B's grant (negative: before); A wrote {} times, {} inside the overlap, {} \
             after B's first write, all refused: {}; A's late write accepted: {}; tokens A {}, \
             B {}; fence's last {:?}",
            measured.overlap_ns as f64 / 1e6,
            self.reason_a,
            (self.told_a_ns as f64 - measured.b_granted_ns as f64) / 1e6,
            self.writes_a.len(),
            measured.in_overlap,
            measured.after_b,
            measured.after_b_refused,
            self.late_a.accepted,
            self.token_a,
            self.token_b,
            self.last,
        )
    }

    /// The overlap and A's writes in and after it, from `report` (B recorded as worker `B`).
    pub fn measure(&self, report: &Report) -> Measured {
        let overlap_ns = report
            .unprotected
            .iter()
            .filter(|o| o.first.key == self.key)
            .map(|o| o.overlap_ns)
            .sum();
        let b_granted_ns = report
            .holds
            .iter()
            .find(|h| h.worker == "B")
            .map(|h| h.start_ns)
            .unwrap();
        let after_b: Vec<&Wrote> = self
            .writes_a
            .iter()
            .filter(|w| w.sent_ns > self.first_b.answered_ns)
            .collect();
        Measured {
            overlap_ns,
            b_granted_ns,
            in_overlap: self
                .writes_a
                .iter()
                .filter(|w| w.sent_ns >= b_granted_ns)
                .count(),
            after_b: after_b.len(),
            after_b_refused: after_b.iter().all(|w| !w.accepted),
        }
    }

    /// The overlap is bounded by A's `lease`; B's writes pass the fence, A's once B wrote (and
    /// its late one) are refused; B's token is above A's and the fence keeps it; A was told
    /// `Failover`, `Disconnected` or `LeaseExpired`.
    pub fn assert_fenced(&self, measured: &Measured, lease: Duration, report: &Report) {
        assert!(
            measured.overlap_ns < lease.as_nanos() as u64,
            "the overlap is bounded by the old holder's lease:\n{report}"
        );
        assert!(
            self.first_b.accepted && self.second_b.accepted,
            "B's writes pass the fence"
        );
        assert!(
            measured.after_b_refused && !self.late_a.accepted,
            "A's writes after B's are refused: {:?}, late: {:?}",
            self.writes_a,
            self.late_a
        );
        let (token_a, token_b) = (self.token_a, self.token_b);
        assert!(token_b > token_a, "{token_b} > {token_a}");
        assert_eq!(self.last, Some(token_b), "the fence keeps B's token");
        assert!(
            matches!(
                self.reason_a,
                LossReason::Failover | LossReason::Disconnected | LossReason::LeaseExpired
            ),
            "{:?}",
            self.reason_a
        );
    }
}
