//! Metrics: a recorder captures what one scripted sequence emits (an acquire, a timeout, a
//! local handoff, a loss, a try that finds the lock taken) on a real ZooKeeper and in memory,
//! and every value is asserted exactly; a session expiry shows in the session metrics; the
//! opt-in key label groups keys by prefix; a Redis server turned replica under a hold counts one
//! failover and one hold lost to it.
//!
//! Each test installs a `DebuggingRecorder` for its own thread only, and runs on a
//! current-thread runtime, so that every task it starts (the session monitor, background
//! releases, spawned waiters) reports to it and tests running beside it do not.

use crate::common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use zklock::{KeyLabel, LockManager, LossReason};

/// What a recorder captured, summed over snapshots (a snapshot resets counters and gauges,
/// and zklock's gauges only go up and down, so summing gives their value).
struct Captured {
    snapshotter: Snapshotter,
    values: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, PartialEq)]
enum Value {
    Counter(u64),
    Gauge(f64),
    Histogram(Vec<f64>),
}

impl Captured {
    fn new(snapshotter: Snapshotter) -> Captured {
        Captured {
            snapshotter,
            values: BTreeMap::new(),
        }
    }

    /// Takes a snapshot and adds it up; returns every metric as `name{label=value,...}`.
    fn take(&mut self) -> &BTreeMap<String, Value> {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let (_, key) = key.into_parts();
            let labels: Vec<String> = key
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            let name = format!("{}{{{}}}", key.name(), labels.join(","));
            let entry = self.values.entry(name);
            match value {
                DebugValue::Counter(n) => {
                    if let Value::Counter(sum) = entry.or_insert(Value::Counter(0)) {
                        *sum += n;
                    }
                }
                DebugValue::Gauge(g) => {
                    if let Value::Gauge(sum) = entry.or_insert(Value::Gauge(0.0)) {
                        *sum += g.into_inner();
                    }
                }
                DebugValue::Histogram(xs) => {
                    if let Value::Histogram(all) = entry.or_insert(Value::Histogram(vec![])) {
                        all.extend(xs.into_iter().map(|x| x.into_inner()));
                    }
                }
            }
        }
        &self.values
    }

    /// Every metric with its value, histograms as their number of samples: what a test
    /// compares exactly.
    fn table(&mut self) -> BTreeMap<String, String> {
        self.take()
            .iter()
            .map(|(name, value)| {
                let shown = match value {
                    Value::Counter(n) => n.to_string(),
                    Value::Gauge(g) => format!("{g}"),
                    Value::Histogram(xs) => format!("{} samples", xs.len()),
                };
                (name.clone(), shown)
            })
            .collect()
    }

    fn get(&mut self, name: &str) -> Option<Value> {
        self.take().get(name).cloned()
    }

    /// Waits (bounded) until `name` has `value`: used to order the script, never to assume.
    async fn until(&mut self, name: &str, value: Value) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while self.get(name).as_ref() != Some(&value) {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{name} never became {value:?}; captured: {:#?}",
                self.table()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

fn expected(rows: &[(&str, &str)]) -> BTreeMap<String, String> {
    rows.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// The scripted sequence on key `orders`: an acquire, a timed-out acquire, a local handoff to
/// a queued task, the loss of that hold (by `lose`), a fresh acquire, a try that finds the lock
/// taken. Returns when everything is released.
async fn script<L, F>(m: &LockManager, captured: &mut Captured, backend: &str, lose: L)
where
    L: FnOnce(zklock::LockGuard) -> F,
    F: std::future::Future<Output = zklock::LockGuard>,
{
    let holds = format!("zklock_holds{{recipe=mutex,backend={backend}}}");
    let waiters = format!("zklock_waiters{{recipe=mutex,backend={backend}}}");

    // An acquire.
    let first = m.lock("orders").await.unwrap();
    captured.until(&holds, Value::Gauge(1.0)).await;

    // A timeout: the lock is held.
    let err = m
        .lock_timeout("orders", Duration::from_millis(50))
        .await
        .unwrap_err();
    assert!(matches!(err, zklock::Error::Timeout { .. }), "{err}");

    // A local handoff: a task of this process queues, the holder lets go.
    let queued = tokio::spawn({
        let m = m.clone();
        async move { m.lock("orders").await.unwrap() }
    });
    captured.until(&waiters, Value::Gauge(1.0)).await;
    drop(first);
    let second = queued.await.unwrap();
    captured.until(&waiters, Value::Gauge(0.0)).await;
    assert_eq!(captured.get(&holds), Some(Value::Gauge(1.0)));

    // A loss: the hold is taken away behind the holder's back.
    let second = lose(second).await;
    assert_eq!(second.loss_reason(), Some(LossReason::NodeDeleted));
    drop(second);

    // A fresh acquire, and a try that finds the lock taken.
    let third = m.lock("orders").await.unwrap();
    assert!(m.try_lock("orders").await.unwrap().is_none());
    third.release().await.unwrap();
    m.flush().await;
}

/// What the script emits on `backend`.
fn scripted(backend: &str) -> BTreeMap<String, String> {
    let b = backend;
    let rows = [
        (
            format!("zklock_acquires_total{{recipe=mutex,backend={b},outcome=ok}}"),
            "3",
        ),
        (
            format!("zklock_acquires_total{{recipe=mutex,backend={b},outcome=timeout}}"),
            "1",
        ),
        (
            format!("zklock_acquires_total{{recipe=mutex,backend={b},outcome=skipped}}"),
            "1",
        ),
        (
            format!("zklock_acquire_wait_seconds{{recipe=mutex,backend={b}}}"),
            "3 samples",
        ),
        (
            format!("zklock_hold_seconds{{recipe=mutex,backend={b}}}"),
            "3 samples",
        ),
        (
            format!("zklock_holds_lost_total{{recipe=mutex,backend={b},reason=node_deleted}}"),
            "1",
        ),
        (format!("zklock_holds{{recipe=mutex,backend={b}}}"), "0"),
        (format!("zklock_waiters{{recipe=mutex,backend={b}}}"), "0"),
        (
            format!("zklock_local_handoffs_total{{recipe=mutex,backend={b}}}"),
            "1",
        ),
        (
            format!("zklock_backend_grants_total{{recipe=mutex,backend={b}}}"),
            "2",
        ),
    ];
    rows.iter()
        .map(|(k, v)| (k.clone(), v.to_string()))
        .collect()
}

#[tokio::test]
async fn a_scripted_sequence_on_zookeeper_emits_exact_metrics() {
    let zk = server();
    let recorder = DebuggingRecorder::new();
    let mut captured = Captured::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let m = manager(&zk.connect_string()).await;

    script(&m, &mut captured, "zookeeper", |guard| async {
        // Someone else deletes the holder's node.
        m.client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager")
            .delete(guard.node_path(), None)
            .await
            .unwrap();
        assert_eq!(guard.lost().await, LossReason::NodeDeleted);
        guard
    })
    .await;

    assert_eq!(captured.table(), scripted("zookeeper"));
    // Waits and holds are times in seconds.
    let Some(Value::Histogram(waits)) =
        captured.get("zklock_acquire_wait_seconds{recipe=mutex,backend=zookeeper}")
    else {
        panic!("no wait times")
    };
    assert!(waits.iter().all(|w| (0.0..30.0).contains(w)), "{waits:?}");
}

#[tokio::test]
async fn the_same_sequence_in_memory_emits_the_same_metrics() {
    let recorder = DebuggingRecorder::new();
    let mut captured = Captured::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let m = LockManager::in_memory();

    script(&m, &mut captured, "memory", |guard| async {
        m.lose("orders", LossReason::NodeDeleted).unwrap();
        guard
    })
    .await;

    assert_eq!(captured.table(), scripted("memory"));
}

#[tokio::test]
async fn a_session_expiry_shows_as_a_state_change_a_renewal_and_lost_holds() {
    let zk = server();
    let recorder = DebuggingRecorder::new();
    let mut captured = Captured::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let connect = zk.connect_string();
    let m = manager(&connect).await;

    let guard = m.lock("ledger").await.unwrap();
    let lease = m.semaphore("exports", 2).unwrap().acquire().await.unwrap();
    // The semaphore lets go of its `locks/` node in the background: let that finish first, or
    // the expiry's connection trouble may make it a release retry.
    m.flush().await;
    expire_session(&m, &connect).await;
    // The server deletes the session's nodes as it expires it: the node watch may tell first.
    let expired = [LossReason::SessionExpired, LossReason::NodeDeleted];
    assert!(expired.contains(&guard.lost().await));
    assert!(expired.contains(&lease.lost().await));
    // What each hold ends with is what its metrics say (read at the same moment as its drop).
    let label = |reason: Option<LossReason>| match reason {
        Some(LossReason::SessionExpired) => "session_expired",
        Some(LossReason::NodeDeleted) => "node_deleted",
        other => panic!("{other:?}"),
    };
    let (mutex_reason, lease_reason) = (label(guard.loss_reason()), label(lease.loss_reason()));
    drop((guard, lease));
    captured
        .until(
            "zklock_session_renewals_total{backend=zookeeper,outcome=ok}",
            Value::Counter(1),
        )
        .await;
    m.flush().await;

    let lost = |recipe: &str, reason: &str| {
        format!("zklock_holds_lost_total{{recipe={recipe},backend=zookeeper,reason={reason}}}")
    };
    let mut table = captured.table();
    // Whether the server's close reaches this session as a disconnection first depends on a
    // race (see `expire_session`): those changes are not part of what is asserted.
    table.retain(|name, _| {
        !name.contains("state=disconnected") && !name.contains("state=connected")
    });
    assert_eq!(
        table,
        expected(&[
            (
                "zklock_acquires_total{recipe=mutex,backend=zookeeper,outcome=ok}",
                "1"
            ),
            (
                "zklock_acquires_total{recipe=semaphore,backend=zookeeper,outcome=ok}",
                "1"
            ),
            (
                "zklock_acquire_wait_seconds{recipe=mutex,backend=zookeeper}",
                "1 samples"
            ),
            (
                "zklock_acquire_wait_seconds{recipe=semaphore,backend=zookeeper}",
                "1 samples"
            ),
            (
                "zklock_backend_grants_total{recipe=mutex,backend=zookeeper}",
                "1"
            ),
            (
                "zklock_backend_grants_total{recipe=semaphore,backend=zookeeper}",
                "1"
            ),
            (
                "zklock_hold_seconds{recipe=mutex,backend=zookeeper}",
                "1 samples"
            ),
            (
                "zklock_hold_seconds{recipe=semaphore,backend=zookeeper}",
                "1 samples"
            ),
            (&lost("mutex", mutex_reason), "1"),
            (&lost("semaphore", lease_reason), "1"),
            ("zklock_holds{recipe=mutex,backend=zookeeper}", "0"),
            ("zklock_holds{recipe=semaphore,backend=zookeeper}", "0"),
            ("zklock_waiters{recipe=mutex,backend=zookeeper}", "0"),
            ("zklock_waiters{recipe=semaphore,backend=zookeeper}", "0"),
            (
                "zklock_session_state_changes_total{backend=zookeeper,state=expired}",
                "1"
            ),
            (
                "zklock_session_renewals_total{backend=zookeeper,outcome=ok}",
                "1"
            ),
        ])
    );
}

#[tokio::test]
async fn the_key_label_is_opt_in_and_can_be_a_prefix() {
    let recorder = DebuggingRecorder::new();
    let mut captured = Captured::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let plain = LockManager::in_memory();
    let grouped = LockManager::in_memory_with(
        LockManager::builder("memory").metrics_key_label(KeyLabel::Prefix(5)),
    );

    drop(plain.lock("user_42").await.unwrap());
    drop(grouped.lock("user_42").await.unwrap());
    drop(grouped.lock("user_7").await.unwrap());
    let rw = grouped.rwlock("sku").unwrap();
    drop(rw.read().await.unwrap());

    let table = captured.table();
    let acquires: BTreeMap<_, _> = table
        .into_iter()
        .filter(|(name, _)| name.starts_with("zklock_acquires_total"))
        .collect();
    assert_eq!(
        acquires,
        expected(&[
            (
                "zklock_acquires_total{recipe=mutex,backend=memory,outcome=ok}",
                "1"
            ),
            (
                "zklock_acquires_total{recipe=mutex,backend=memory,outcome=ok,key=user_}",
                "2"
            ),
            (
                "zklock_acquires_total{recipe=read,backend=memory,outcome=ok,key=sku}",
                "1"
            ),
        ])
    );
}

#[tokio::test]
async fn a_job_stopped_at_its_hold_limit_counts_as_a_hold_lost_for_it() {
    let recorder = DebuggingRecorder::new();
    let mut captured = Captured::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let m = LockManager::in_memory();

    let job = m.job("nightly").unwrap().at_most(Duration::from_millis(20));
    let err = job.run(std::future::pending::<()>()).await.unwrap_err();
    assert!(
        matches!(
            err,
            zklock::Error::LockLost {
                reason: LossReason::HoldLimit,
                ..
            }
        ),
        "{err}"
    );
    // A job takes its lock with a try: it never counts as a waiter.
    let table = captured.table();
    let job_rows: BTreeMap<_, _> = table
        .into_iter()
        .filter(|(name, _)| name.contains("recipe=job"))
        .collect();
    assert_eq!(
        job_rows,
        expected(&[
            (
                "zklock_acquires_total{recipe=job,backend=memory,outcome=ok}",
                "1"
            ),
            (
                "zklock_acquire_wait_seconds{recipe=job,backend=memory}",
                "1 samples"
            ),
            (
                "zklock_backend_grants_total{recipe=job,backend=memory}",
                "1"
            ),
            (
                "zklock_hold_seconds{recipe=job,backend=memory}",
                "1 samples"
            ),
            (
                "zklock_holds_lost_total{recipe=job,backend=memory,reason=hold_limit}",
                "1"
            ),
            ("zklock_holds{recipe=job,backend=memory}", "0"),
        ])
    );
}

#[tokio::test]
async fn a_prometheus_scrape_shows_them_with_help_and_buckets() {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    let recorder = PrometheusBuilder::new()
        .set_buckets_for_metric(
            Matcher::Prefix("zklock_".into()),
            zklock::metrics::SECONDS_BUCKETS,
        )
        .unwrap()
        .build_recorder();
    let handle = recorder.handle();
    let _local = metrics::set_default_local_recorder(&recorder);
    zklock::metrics::describe();
    let m = LockManager::in_memory();

    let guard = m.lock("sku_1").await.unwrap();
    assert!(m.try_lock("sku_1").await.unwrap().is_none());
    m.lose("sku_1", LossReason::SessionExpired).unwrap();
    drop(guard);

    let scrape = handle.render();
    for line in [
        "# HELP zklock_acquires_total Lock acquires that ended, by outcome (ok, timeout, error, skipped)",
        "# TYPE zklock_acquires_total counter",
        r#"zklock_acquires_total{recipe="mutex",backend="memory",outcome="ok"} 1"#,
        r#"zklock_acquires_total{recipe="mutex",backend="memory",outcome="skipped"} 1"#,
        r#"zklock_holds_lost_total{recipe="mutex",backend="memory",reason="session_expired"} 1"#,
        r#"zklock_backend_grants_total{recipe="mutex",backend="memory"} 1"#,
        r#"zklock_holds{recipe="mutex",backend="memory"} 0"#,
        "# TYPE zklock_acquire_wait_seconds histogram",
        r#"zklock_acquire_wait_seconds_bucket{recipe="mutex",backend="memory",le="+Inf"} 1"#,
        r#"zklock_acquire_wait_seconds_count{recipe="mutex",backend="memory"} 1"#,
        r#"zklock_hold_seconds_count{recipe="mutex",backend="memory"} 1"#,
    ] {
        assert!(
            scrape.lines().any(|l| l == line),
            "missing {line:?} in:\n{scrape}"
        );
    }
}

#[tokio::test]
async fn without_a_recorder_nothing_is_emitted_and_locks_work() {
    // The facade's no-op: nothing to capture, and the locks behave the same.
    let recorder = DebuggingRecorder::new();
    let mut captured = Captured::new(recorder.snapshotter());
    let m = LockManager::in_memory();
    drop(m.lock("k").await.unwrap());
    assert!(m.try_lock("k").await.unwrap().is_some());
    assert!(captured.table().is_empty());
}

#[tokio::test]
async fn a_failover_counts_once_with_the_holds_it_ended() {
    let recorder = DebuggingRecorder::new();
    let mut captured = Captured::new(recorder.snapshotter());
    let _local = metrics::set_default_local_recorder(&recorder);
    let a = zklock_testkit::RedisServer::start().unwrap();
    let b = zklock_testkit::RedisServer::start().unwrap();
    let m = LockManager::builder(a.url())
        .redis(|r| r.lease(Duration::from_secs(3)))
        .connect()
        .await
        .unwrap();
    let held = m.lock("failing_over").await.unwrap();
    // The server turns replica under the hold: its next renewal is refused with -READONLY.
    let other = b.url();
    let (host, port) = other
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .rsplit_once(':')
        .unwrap();
    let mut c = redis::Client::open(a.url())
        .unwrap()
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .unwrap();
    let _: () = redis::cmd("REPLICAOF")
        .arg(host)
        .arg(port)
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(held.lost().await, LossReason::Failover);
    drop(held);
    captured
        .until(
            "zklock_holds_lost_total{recipe=mutex,backend=redis,reason=failover}",
            Value::Counter(1),
        )
        .await;
    assert_eq!(
        captured.get("zklock_failovers_total{backend=redis}"),
        Some(Value::Counter(1)),
        "{:#?}",
        captured.table()
    );
}
