//! Metrics an operator can alert on, through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! zklock emits to whatever recorder the application installed (a Prometheus exporter, StatsD,
//! a test recorder); with none installed every call is the facade's no-op, and the label sets
//! are static: no allocation per acquire. zklock forces no exporter on you.
//!
//! # Every metric
//!
//! Labels: `recipe` is `mutex`, `read`, `write`, `semaphore`, `leader` or `job` (a
//! [`MultiGuard`](crate::MultiGuard)'s parts count under their own recipes); `backend` is `zk`,
//! `redis`, `postgres` or `memory`. No label carries a raw key unless you opt in with
//! [`Builder::metrics_key_label`](crate::Builder::metrics_key_label), which adds a `key` label
//! (the key, or its first N characters) to the per-lock metrics (those labelled `recipe`).
//!
//! | name | type | labels | meaning |
//! | --- | --- | --- | --- |
//! | `zklock_acquires_total` | counter | recipe, backend, outcome | Acquires that ended: `outcome` is `ok` (granted), `timeout` (the wait or the manager's `try_timeout` ran out), `error` (any other error: the session ended, the manager closed...) or `skipped` (a `try_*` that found the lock taken). Re-entries of a hold an enclosing frame has are not acquires. |
//! | `zklock_acquire_wait_seconds` | histogram | recipe, backend | How long each granted acquire waited, from the call to the grant (local queue, server round trips and other holders included). |
//! | `zklock_hold_seconds` | histogram | recipe, backend | How long each hold lasted, from the grant to its end (release, drop, or handing it on to the next local task). |
//! | `zklock_holds_lost_total` | counter | recipe, backend, reason | Holds that ended lost, by [`LossReason`]: `session_expired`, `disconnected`, `node_deleted`, `lease_expired`, `revoked`, `closed`, `hold_limit`. Counted once per hold, when it ends. |
//! | `zklock_holds` | gauge | recipe, backend | Holds of this process now (guards and leases, re-entries counted once). |
//! | `zklock_waiters` | gauge | recipe, backend | Tasks of this process waiting for a lock now (blocking acquires in flight; tries do not count). |
//! | `zklock_local_handoffs_total` | counter | recipe, backend | Holds handed to the next task of this process on release, without a server round trip (the local queue). |
//! | `zklock_backend_grants_total` | counter | recipe, backend | Holds the backend granted (a contender node on ZooKeeper, a lease on Redis, an advisory lock on PostgreSQL): each is server round trips. With `zklock_local_handoffs_total`, what the local queue saves. |
//! | `zklock_session_state_changes_total` | counter | backend, state | ZooKeeper session state changes the manager saw: `state` is `connected`, `read_only`, `disconnected`, `expired`, `closed` or `auth_failed`. |
//! | `zklock_session_renewals_total` | counter | backend, outcome | Attempts to open a new ZooKeeper session after the last one expired: `outcome` `ok` or `error` (retried). |
//! | `zklock_release_retries_total` | counter | backend | Releases sent again after a connection loss (a node delete on ZooKeeper, an unlock on Redis), in the background or in `release().await`. |
//!
//! Times are in seconds. [`describe`] registers these descriptions and units with the
//! installed recorder; [`SECONDS_BUCKETS`] are histogram buckets that suit lock waits and holds.
//!
//! # Examples
//!
//! Serving them to Prometheus with `metrics-exporter-prometheus` (any exporter works):
//!
//! ```ignore
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//!
//! let handle = PrometheusBuilder::new()
//!     .set_buckets_for_metric(Matcher::Prefix("zklock_".into()), zklock::metrics::SECONDS_BUCKETS)?
//!     .install_recorder()?;
//! zklock::metrics::describe();
//! let upkeep = handle.clone();
//! tokio::spawn(async move {
//!     loop {
//!         tokio::time::sleep(std::time::Duration::from_secs(5)).await;
//!         upkeep.run_upkeep();
//!     }
//! });
//! let manager = zklock::LockManager::connect("zk1:2181").await?;
//! // ... and answer GET /metrics with handle.render()
//! ```
//!
//! Capturing them in a test, with `metrics-util`'s `DebuggingRecorder` for this thread only:
//!
//! ```ignore
//! let recorder = metrics_util::debugging::DebuggingRecorder::new();
//! let snapshotter = recorder.snapshotter();
//! let _local = metrics::set_default_local_recorder(&recorder);
//! drop(zklock::LockManager::in_memory().lock("k").await?);
//! // snapshotter.snapshot(): zklock_acquires_total{recipe="mutex",backend="memory",outcome="ok"} 1, ...
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use ::metrics::{Key, Label, Level, Metadata, Recorder, Unit};
use once_cell::sync::Lazy;

use crate::types::backend_kind::BackendKind;
use crate::types::loss::LossReason;

/// Name of the acquires counter (see the [module docs](self)).
pub const ACQUIRES: &str = "zklock_acquires_total";
/// Name of the wait time histogram, seconds.
pub const ACQUIRE_WAIT: &str = "zklock_acquire_wait_seconds";
/// Name of the hold time histogram, seconds.
pub const HOLD_TIME: &str = "zklock_hold_seconds";
/// Name of the lost holds counter.
pub const HOLDS_LOST: &str = "zklock_holds_lost_total";
/// Name of the current holds gauge.
pub const HOLDS: &str = "zklock_holds";
/// Name of the current waiters gauge.
pub const WAITERS: &str = "zklock_waiters";
/// Name of the local handoffs counter.
pub const LOCAL_HANDOFFS: &str = "zklock_local_handoffs_total";
/// Name of the backend grants counter (server round trips).
pub const BACKEND_GRANTS: &str = "zklock_backend_grants_total";
/// Name of the ZooKeeper session state changes counter.
pub const SESSION_STATE_CHANGES: &str = "zklock_session_state_changes_total";
/// Name of the ZooKeeper session renewals counter.
pub const SESSION_RENEWALS: &str = "zklock_session_renewals_total";
/// Name of the release retries counter.
pub const RELEASE_RETRIES: &str = "zklock_release_retries_total";
/// Counter: failovers of the store to a new primary that this process saw, by `backend`
/// (Redis under Sentinel: a `+switch-master`, or the server it wrote to turned replica). The
/// holds they ended count in [`HOLDS_LOST`] with `reason="failover"`.
pub const FAILOVERS: &str = "zklock_failovers_total";

/// Histogram buckets (seconds) that suit lock waits and holds: 1 ms to 5 min.
///
/// ```
/// assert_eq!(zklock_core::metrics::SECONDS_BUCKETS.first(), Some(&0.001));
/// ```
pub const SECONDS_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
];

/// Whether per-lock metrics carry the lock's key as a `key` label; see
/// [`Builder::metrics_key_label`](crate::Builder::metrics_key_label).
///
/// Keys often come from requests: a label per key can grow without bound and overwhelm a
/// metrics store. `Prefix(n)` keeps the first `n` characters (`"user_"` for `"user_42"` with
/// `Prefix(5)`), so that keys group by kind.
///
/// # Examples
///
/// ```
/// use zklock_core::metrics::KeyLabel;
///
/// assert_eq!(KeyLabel::default(), KeyLabel::None);
/// assert_eq!(KeyLabel::Prefix(5).label("user_42").as_deref(), Some("user_"));
/// assert_eq!(KeyLabel::Full.label("user_42").as_deref(), Some("user_42"));
/// assert_eq!(KeyLabel::None.label("user_42"), None);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum KeyLabel {
    /// No key label (default).
    #[default]
    None,
    /// The first N characters of the key.
    Prefix(usize),
    /// The whole key: only for a small, fixed set of keys.
    Full,
}

impl KeyLabel {
    /// The `key` label this option gives `key`, if any.
    pub fn label(self, key: &str) -> Option<Arc<str>> {
        match self {
            KeyLabel::None => None,
            KeyLabel::Full => Some(key.into()),
            KeyLabel::Prefix(n) => Some(match key.char_indices().nth(n) {
                Some((end, _)) => key[..end].into(),
                None => key.into(),
            }),
        }
    }
}

/// Registers the description and unit of every zklock metric with the installed recorder
/// (exporters show them, e.g. as Prometheus `# HELP` lines). Call it once, after installing
/// the recorder; without it the metrics are emitted all the same.
///
/// ```
/// zklock_core::metrics::describe(); // a no-op without a recorder
/// ```
pub fn describe() {
    use ::metrics::{describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        ACQUIRES,
        Unit::Count,
        "Lock acquires that ended, by outcome (ok, timeout, error, skipped)"
    );
    describe_histogram!(
        ACQUIRE_WAIT,
        Unit::Seconds,
        "How long granted acquires waited for the lock"
    );
    describe_histogram!(HOLD_TIME, Unit::Seconds, "How long holds lasted");
    describe_counter!(
        HOLDS_LOST,
        Unit::Count,
        "Holds that ended lost, by reason (session_expired, node_deleted, ...)"
    );
    describe_gauge!(HOLDS, Unit::Count, "Holds of this process now");
    describe_gauge!(
        WAITERS,
        Unit::Count,
        "Tasks of this process waiting for a lock now"
    );
    describe_counter!(
        LOCAL_HANDOFFS,
        Unit::Count,
        "Holds handed to the next local task without a server round trip"
    );
    describe_counter!(
        BACKEND_GRANTS,
        Unit::Count,
        "Holds granted by the backend (server round trips)"
    );
    describe_counter!(
        SESSION_STATE_CHANGES,
        Unit::Count,
        "ZooKeeper session state changes, by state"
    );
    describe_counter!(
        SESSION_RENEWALS,
        Unit::Count,
        "Attempts to open a new ZooKeeper session after expiry, by outcome"
    );
    describe_counter!(
        RELEASE_RETRIES,
        Unit::Count,
        "Releases sent again after a connection loss"
    );
    describe_counter!(
        FAILOVERS,
        Unit::Count,
        "Failovers of the store to a new primary that this process saw (Redis Sentinel)"
    );
}

/// Which recipe a per-lock metric is about (its `recipe` label): the API an acquire came
/// through, not only what it holds (`types::mode::HoldMode`), so that a job's acquire counts as
/// `job` rather than as a mutex.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Recipe {
    Mutex,
    Read,
    Write,
    Semaphore,
    Leader,
    Job,
}

const RECIPES: &[(&str, &str)] = &[
    ("recipe", "mutex"),
    ("recipe", "read"),
    ("recipe", "write"),
    ("recipe", "semaphore"),
    ("recipe", "leader"),
    ("recipe", "job"),
];

/// The `backend` label's values, indexed by [`BackendKind`] (`kind as usize`).
const BACKENDS: &[(&str, &str)] = &[
    ("backend", BackendKind::ALL[0].label()),
    ("backend", BackendKind::ALL[1].label()),
    ("backend", BackendKind::ALL[2].label()),
    ("backend", BackendKind::ALL[3].label()),
    ("backend", BackendKind::ALL[4].label()),
    ("backend", BackendKind::ALL[5].label()),
];
// One label a backend, in the order of `BackendKind::ALL` (which metrics index by).
const _: () = assert!(BACKENDS.len() == BackendKind::ALL.len());

/// How an acquire ended (the `outcome` label of [`ACQUIRES`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Ok,
    Timeout,
    Error,
    Skipped,
}

const OUTCOMES: &[(&str, &str)] = &[
    ("outcome", "ok"),
    ("outcome", "timeout"),
    ("outcome", "error"),
    ("outcome", "skipped"),
];

impl Outcome {
    /// The outcome of an acquire that returned `result` (`Ok(None)`: a try found it taken).
    pub(crate) fn of<T>(result: &crate::types::error::Result<Option<T>>) -> Outcome {
        match result {
            Ok(Some(_)) => Outcome::Ok,
            Ok(None) => Outcome::Skipped,
            Err(crate::types::error::Error::Timeout { .. }) => Outcome::Timeout,
            Err(_) => Outcome::Error,
        }
    }
}

const REASONS: &[(&str, &str)] = &[
    ("reason", "session_expired"),
    ("reason", "disconnected"),
    ("reason", "node_deleted"),
    ("reason", "lease_expired"),
    ("reason", "revoked"),
    ("reason", "closed"),
    ("reason", "hold_limit"),
    ("reason", "failover"),
];

fn reason_index(reason: LossReason) -> usize {
    match reason {
        LossReason::SessionExpired => 0,
        LossReason::Disconnected => 1,
        LossReason::NodeDeleted => 2,
        LossReason::LeaseExpired => 3,
        LossReason::Revoked => 4,
        LossReason::Closed => 5,
        LossReason::HoldLimit => 6,
        LossReason::Failover => 7,
    }
}

/// A ZooKeeper session state, as the `state` label of [`SESSION_STATE_CHANGES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
pub(crate) enum SessionState {
    Connected,
    ReadOnly,
    Disconnected,
    Expired,
    Closed,
    AuthFailed,
}

#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
const STATES: &[(&str, &str)] = &[
    ("state", "connected"),
    ("state", "read_only"),
    ("state", "disconnected"),
    ("state", "expired"),
    ("state", "closed"),
    ("state", "auth_failed"),
];

#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
const RENEWALS: &[(&str, &str)] = &[("outcome", "ok"), ("outcome", "error")];

/// Where every emission is said to come from.
static METADATA: Metadata<'static> = Metadata::new("zklock", Level::INFO, Some("zklock_core"));

/// The keys of one metric: one per combination of its label values, built once, so that an
/// emission only picks one (no allocation, no hashing).
struct Family {
    keys: Lazy<Box<[Key]>>,
}

/// Every combination of `dims`' label values, as keys of `name`; the first dimension varies
/// slowest.
fn keys(name: &'static str, dims: &[&[(&'static str, &'static str)]]) -> Box<[Key]> {
    let mut combos: Vec<Vec<Label>> = vec![vec![]];
    for dim in dims {
        combos = combos
            .into_iter()
            .flat_map(|prefix| {
                dim.iter().map(move |(k, v)| {
                    let mut labels = prefix.clone();
                    labels.push(Label::from_static_parts(k, v));
                    labels
                })
            })
            .collect();
    }
    combos
        .into_iter()
        .map(|labels| Key::from_parts(name, labels))
        .collect()
}

macro_rules! family {
    ($static:ident, $name:expr, [$($dim:expr),*]) => {
        static $static: Family = Family {
            keys: Lazy::new(|| keys($name, &[$($dim),*])),
        };
    };
}

family!(ACQUIRES_KEYS, ACQUIRES, [RECIPES, BACKENDS, OUTCOMES]);
family!(WAIT_KEYS, ACQUIRE_WAIT, [RECIPES, BACKENDS]);
family!(HOLD_TIME_KEYS, HOLD_TIME, [RECIPES, BACKENDS]);
family!(HOLDS_LOST_KEYS, HOLDS_LOST, [RECIPES, BACKENDS, REASONS]);
family!(HOLDS_KEYS, HOLDS, [RECIPES, BACKENDS]);
family!(WAITERS_KEYS, WAITERS, [RECIPES, BACKENDS]);
family!(HANDOFFS_KEYS, LOCAL_HANDOFFS, [RECIPES, BACKENDS]);
family!(GRANTS_KEYS, BACKEND_GRANTS, [RECIPES, BACKENDS]);
family!(STATE_KEYS, SESSION_STATE_CHANGES, [BACKENDS, STATES]);
family!(RENEWAL_KEYS, SESSION_RENEWALS, [BACKENDS, RENEWALS]);
family!(RETRY_KEYS, RELEASE_RETRIES, [BACKENDS]);
family!(FAILOVER_KEYS, FAILOVERS, [BACKENDS]);

/// Runs `emit` with the installed recorder and the key at `index` of `family`, extended by a
/// `key` label if there is one (that one is built per call: the opt-in costs an allocation).
fn with_key(
    family: &Family,
    index: usize,
    key: Option<&Arc<str>>,
    emit: impl FnOnce(&dyn Recorder, &Key),
) {
    ::metrics::with_recorder(|recorder| {
        let base = &family.keys[index];
        match key {
            None => emit(recorder, base),
            Some(key) => emit(
                recorder,
                &base.with_extra_labels(vec![Label::new("key", key.to_string())]),
            ),
        }
    })
}

fn increment(family: &Family, index: usize, key: Option<&Arc<str>>, n: u64) {
    with_key(family, index, key, |r, k| {
        r.register_counter(k, &METADATA).increment(n)
    })
}

fn gauge(family: &Family, index: usize, key: Option<&Arc<str>>, delta: f64) {
    with_key(family, index, key, |r, k| {
        let gauge = r.register_gauge(k, &METADATA);
        if delta >= 0.0 {
            gauge.increment(delta)
        } else {
            gauge.decrement(-delta)
        }
    })
}

fn record(family: &Family, index: usize, key: Option<&Arc<str>>, value: Duration) {
    with_key(family, index, key, |r, k| {
        r.register_histogram(k, &METADATA)
            .record(value.as_secs_f64())
    })
}

/// The labels of one lock's metrics: its recipe, its backend, and the opt-in key label.
#[derive(Debug, Clone)]
pub(crate) struct Labels {
    recipe: Recipe,
    backend: BackendKind,
    key: Option<Arc<str>>,
}

impl Labels {
    /// The labels of `key`'s lock of `recipe` on `backend`.
    pub(crate) fn new(
        recipe: Recipe,
        backend: BackendKind,
        key_label: KeyLabel,
        key: &str,
    ) -> Labels {
        Labels {
            recipe,
            backend,
            key: key_label.label(key),
        }
    }

    /// The same lock under another recipe (a downgraded write hold is a read hold).
    pub(crate) fn with_recipe(&self, recipe: Recipe) -> Labels {
        Labels {
            recipe,
            ..self.clone()
        }
    }

    /// Index of the (recipe, backend) combination, times `per` values of a third label.
    fn base(&self, per: usize) -> usize {
        (self.recipe as usize * BACKENDS.len() + self.backend as usize) * per
    }

    /// An acquire ended with `outcome`, after `waited` (recorded when granted).
    pub(crate) fn acquired(&self, outcome: Outcome, waited: Duration) {
        let key = self.key.as_ref();
        increment(
            &ACQUIRES_KEYS,
            self.base(OUTCOMES.len()) + outcome as usize,
            key,
            1,
        );
        if outcome == Outcome::Ok {
            record(&WAIT_KEYS, self.base(1), key, waited);
        }
    }

    /// A hold was handed to the next local task.
    pub(crate) fn local_handoff(&self) {
        increment(&HANDOFFS_KEYS, self.base(1), self.key.as_ref(), 1);
    }

    /// The backend granted `n` holds.
    pub(crate) fn backend_grants(&self, n: u64) {
        increment(&GRANTS_KEYS, self.base(1), self.key.as_ref(), n);
    }

    /// Counts a waiting task until the returned value drops.
    pub(crate) fn waiting(&self) -> Waiting {
        gauge(&WAITERS_KEYS, self.base(1), self.key.as_ref(), 1.0);
        Waiting {
            labels: self.clone(),
        }
    }

    /// Counts a hold granted at `since` until [`HoldMeter::end`] (or its drop).
    pub(crate) fn hold(&self, since: Instant) -> HoldMeter {
        gauge(&HOLDS_KEYS, self.base(1), self.key.as_ref(), 1.0);
        HoldMeter {
            labels: Some(self.clone()),
            since,
        }
    }
}

/// A waiting task, counted in [`WAITERS`] until dropped (a cancelled acquire included).
pub(crate) struct Waiting {
    labels: Labels,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let l = &self.labels;
        gauge(&WAITERS_KEYS, l.base(1), l.key.as_ref(), -1.0);
    }
}

/// A hold, counted in [`HOLDS`] until it ends; its end records its time and, when it ended
/// lost, its reason.
pub(crate) struct HoldMeter {
    labels: Option<Labels>,
    since: Instant,
}

impl HoldMeter {
    /// The hold ended; `lost` tells whether it was lost and why. Only the first call counts.
    pub(crate) fn end(&mut self, lost: Option<LossReason>) {
        self.end_after(lost, self.since.elapsed())
    }

    /// [`end`](Self::end), with the hold's time already measured (no second clock read).
    pub(crate) fn end_after(&mut self, lost: Option<LossReason>, held: Duration) {
        let Some(l) = self.labels.take() else {
            return;
        };
        let key = l.key.as_ref();
        gauge(&HOLDS_KEYS, l.base(1), key, -1.0);
        record(&HOLD_TIME_KEYS, l.base(1), key, held);
        if let Some(reason) = lost {
            increment(
                &HOLDS_LOST_KEYS,
                l.base(REASONS.len()) + reason_index(reason),
                key,
                1,
            );
        }
    }
}

impl HoldMeter {
    /// The hold never started (a handoff nobody took): uncount it, record nothing.
    pub(crate) fn discard(&mut self) {
        if let Some(l) = self.labels.take() {
            gauge(&HOLDS_KEYS, l.base(1), l.key.as_ref(), -1.0);
        }
    }
}

impl Drop for HoldMeter {
    fn drop(&mut self) {
        self.end(None);
    }
}

/// A ZooKeeper session changed state.
#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
pub(crate) fn session_state(state: SessionState) {
    let index = BackendKind::ZooKeeper as usize * STATES.len() + state as usize;
    increment(&STATE_KEYS, index, None, 1);
}

/// An attempt to open a new ZooKeeper session after expiry ended (`ok`: it opened).
#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
pub(crate) fn session_renewal(ok: bool) {
    let index = BackendKind::ZooKeeper as usize * RENEWALS.len() + usize::from(!ok);
    increment(&RENEWAL_KEYS, index, None, 1);
}

/// A release was sent again after a connection loss.
#[cfg_attr(not(any(feature = "zookeeper", feature = "redis")), allow(dead_code))]
pub(crate) fn release_retry(backend: BackendKind) {
    increment(&RETRY_KEYS, backend as usize, None, 1);
}

/// The backend saw its store fail over to a new primary.
#[cfg_attr(not(feature = "redis"), allow(dead_code))]
pub(crate) fn failover(backend: BackendKind) {
    increment(&FAILOVER_KEYS, backend as usize, None, 1);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_combination_has_its_key() {
        assert_eq!(
            ACQUIRES_KEYS.keys.len(),
            RECIPES.len() * BACKENDS.len() * OUTCOMES.len()
        );
        let l = Labels::new(Recipe::Job, BackendKind::Postgres, KeyLabel::None, "k");
        let key = &ACQUIRES_KEYS.keys[l.base(OUTCOMES.len()) + Outcome::Skipped as usize];
        let labels: Vec<_> = key.labels().map(|l| (l.key(), l.value())).collect();
        assert_eq!(
            labels,
            [
                ("recipe", "job"),
                ("backend", "postgres"),
                ("outcome", "skipped")
            ]
        );
        let lost =
            &HOLDS_LOST_KEYS.keys[l.base(REASONS.len()) + reason_index(LossReason::HoldLimit)];
        assert_eq!(lost.labels().last().unwrap().value(), "hold_limit");
        let state = &STATE_KEYS.keys
            [BackendKind::ZooKeeper as usize * STATES.len() + SessionState::AuthFailed as usize];
        assert_eq!(
            state.labels().map(|l| l.value()).collect::<Vec<_>>(),
            ["zookeeper", "auth_failed"]
        );
    }
}
