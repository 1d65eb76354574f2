//! A bounded soak: mixed mutex and read/write traffic from four sessions against a 3-node
//! ensemble, each session behind its own fault-injecting proxies, while random faults from the
//! fault scenarios are injected one after another: the leader killed or isolated, a follower
//! restarted, a client partitioned past its session timeout, its connections reset, the reply to
//! its create lost, its session expired from another handle, a storm of cancelled acquires.
//!
//! It ends in a report — operations, faults injected, violations (must be 0), leaked nodes and
//! leaked watches (must be 0) — printed even when the test passes.
//!
//! 60 seconds by default; `ZKLOCK_SOAK_SECS=600 cargo test --test soak` soaks longer, and
//! `ZKLOCK_SOAK_SEED=<n>` replays a fault schedule.

mod common;
mod faults;

use std::collections::BTreeMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use faults::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zklock::{DisconnectPolicy, LockManager};
use zklock_testkit::{History, Mode, Proxy, Recorder, ZkCluster};

const SESSION: Duration = Duration::from_secs(4);
const QUORUM: Duration = Duration::from_secs(60);
const KEYS: [&str; 2] = ["soak-a", "soak-b"];

fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// Prints past the test harness's capture, so that the report shows in CI's log.
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

struct Client {
    manager: LockManager,
    proxies: Vec<Proxy>,
    workers: Vec<String>,
}

/// One acquire abandoned (or not) at a random point, recorded.
async fn cancelled_acquire(m: LockManager, key: &'static str, rec: Recorder, after: Duration) {
    rec.acquire_invoked(key, Mode::Exclusive);
    match tokio::time::timeout(after, m.lock(key)).await {
        Ok(Ok(guard)) => {
            rec.acquire_ok(key, Mode::Exclusive, guard.fencing_token().as_u128());
            rec.release_invoked(key);
            drop(guard);
        }
        Ok(Err(e)) => rec.acquire_failed(key, Mode::Exclusive, e),
        Err(_) => rec.acquire_failed(key, Mode::Exclusive, "dropped"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_random_faults_under_mixed_traffic() {
    let secs: u64 = std::env::var("ZKLOCK_SOAK_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60)
        .max(5);
    let seed: u64 = std::env::var("ZKLOCK_SOAK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    say(&format!(
        "soak: {secs} s, seed {seed} (ZKLOCK_SOAK_SECS, ZKLOCK_SOAK_SEED to change)"
    ));

    let mut cluster = blocking(|| ZkCluster::start(3)).unwrap();
    let direct = cluster.connect_string();
    let admin = LockManager::builder(&direct)
        .session_timeout(Duration::from_secs(20))
        .connect()
        .await
        .unwrap();
    let history = History::new();
    let crew = Crew::new();
    let work = Work {
        wait: Duration::from_secs(20),
        hold: Duration::from_millis(15),
        think: Duration::from_millis(10),
    };

    // Four sessions, each through its own proxy to every member; two treat a disconnection as
    // a loss, two have a grace well under the session timeout.
    let mut clients = Vec::new();
    let mut tasks = Vec::new();
    for i in 0..4 {
        let proxies: Vec<Proxy> = (0..cluster.len())
            .map(|j| Proxy::start(&cluster.member_connect_string(j)).unwrap())
            .collect();
        let connect = proxies
            .iter()
            .map(Proxy::connect_string)
            .collect::<Vec<_>>()
            .join(",");
        let mut builder = LockManager::builder(connect).session_timeout(SESSION);
        if i % 2 == 1 {
            builder = builder.disconnect_policy(DisconnectPolicy::Grace(Duration::from_secs(1)));
        }
        let manager = builder.connect().await.unwrap();
        let mut workers = Vec::new();
        for key in KEYS {
            let name = format!("c{i}/{key}");
            tasks.push(tokio::spawn(mutex_worker(
                manager.clone(),
                key.to_string(),
                history.recorder(&name),
                crew.clone(),
                work,
            )));
            workers.push(name);
        }
        let name = format!("c{i}/rw");
        tasks.push(tokio::spawn(rw_worker(
            manager.clone(),
            "soak-rw".to_string(),
            history.recorder(&name),
            crew.clone(),
            work,
            3,
        )));
        workers.push(name);
        clients.push(Client {
            manager,
            proxies,
            workers,
        });
    }
    crew.until_grants(0, 20, Duration::from_secs(30)).await;

    let started = Instant::now();
    let deadline = started + Duration::from_secs(secs);
    let mut injected: BTreeMap<&'static str, u64> = BTreeMap::new();
    let storms = Arc::new(AtomicU64::new(0));
    while Instant::now() < deadline {
        // Traffic between faults.
        let calm = Duration::from_millis(rng.gen_range(1500..3000));
        tokio::time::sleep(calm).await;
        let c = rng.gen_range(0..clients.len());
        let client = &clients[c];
        let before = crew.grants();
        let kind = match rng.gen_range(0..8) {
            0 => {
                let leader = cluster.leader().expect("a leader");
                history.fault(&format!("killed the leader {leader}"));
                blocking(|| cluster.stop_member(leader)).unwrap();
                blocking(|| cluster.wait_for_quorum(QUORUM)).unwrap();
                crew.until_grants(before, 3, QUORUM).await;
                blocking(|| cluster.restart_member(leader)).unwrap();
                "kill leader"
            }
            1 => {
                let leader = cluster.leader().expect("a leader");
                history.fault(&format!("isolated the leader {leader}"));
                blocking(|| cluster.pause_member(leader)).unwrap();
                blocking(|| cluster.wait_for_quorum(QUORUM)).unwrap();
                crew.until_grants(before, 3, QUORUM).await;
                blocking(|| cluster.resume_member(leader)).unwrap();
                "isolate leader"
            }
            2 => {
                let leader = cluster.leader();
                let follower = (0..cluster.len()).find(|i| Some(*i) != leader).unwrap();
                history.fault(&format!("restarted follower {follower}"));
                blocking(|| cluster.restart_member(follower)).unwrap();
                "restart follower"
            }
            3 => {
                history.fault(&format!("partitioned client {c} past its session timeout"));
                for p in &client.proxies {
                    p.blackhole();
                }
                tokio::time::sleep(SESSION + Duration::from_secs(1)).await;
                for p in &client.proxies {
                    p.heal();
                }
                "partition client"
            }
            4 => {
                history.fault(&format!("reset client {c}'s connections"));
                for p in &client.proxies {
                    p.reset();
                }
                "reset connections"
            }
            5 => {
                history.fault(&format!("lose the reply to client {c}'s next create"));
                for p in &client.proxies {
                    p.drop_reply_to_nth_create(1);
                }
                "lost create reply"
            }
            6 => {
                for w in &client.workers {
                    history.silent_fault(w, "session expired from another handle");
                }
                common::expire_session(&client.manager, &direct).await;
                "expire session"
            }
            _ => {
                let n = storms.fetch_add(1, Ordering::SeqCst);
                history.fault("a storm of cancelled acquires");
                let mut storm = Vec::new();
                for k in 0..24 {
                    let m = clients[k % clients.len()].manager.clone();
                    let key = KEYS[k % KEYS.len()];
                    let after = Duration::from_micros(rng.gen_range(0..30_000));
                    storm.push(tokio::spawn(cancelled_acquire(
                        m,
                        key,
                        history.recorder(&format!("storm-{n}-{k}")),
                        after,
                    )));
                }
                for t in storm {
                    tokio::time::timeout(Duration::from_secs(60), t)
                        .await
                        .expect("a storm acquire ends")
                        .unwrap();
                }
                "cancel storm"
            }
        };
        *injected.entry(kind).or_default() += 1;
        blocking(|| cluster.wait_for_quorum(QUORUM)).unwrap();
    }

    // Heal everything, let the traffic show it recovered, then stop it.
    for client in &clients {
        for p in &client.proxies {
            p.heal();
        }
    }
    blocking(|| cluster.wait_for_quorum(QUORUM)).unwrap();
    crew.until_grants(crew.grants(), 10, QUORUM).await;
    crew.stop();
    for t in tasks {
        tokio::time::timeout(Duration::from_secs(60), t)
            .await
            .expect("workers stop")
            .unwrap();
    }
    for client in &clients {
        tokio::time::timeout(Duration::from_secs(60), client.manager.flush())
            .await
            .expect("background releases finish");
    }

    let report = history.check();
    // Leaks: contender nodes still there once every session has settled, and watches the
    // servers still keep for the lock paths.
    let leak_deadline = Instant::now() + Duration::from_secs(20);
    let (leaked_nodes, leaked_watches) = loop {
        let nodes = contenders(&admin.zk_client(), ROOT).await;
        let watches: Vec<String> = (0..cluster.len())
            .filter_map(|i| cluster.member_four_letter(i, "wchp").ok())
            .flat_map(|w| watched_paths(&w, ROOT))
            .collect();
        if (nodes.is_empty() && watches.is_empty()) || Instant::now() > leak_deadline {
            break (nodes, watches);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let faults: u64 = injected.values().sum();
    say(&format!(
        "soak report: {} s, seed {seed}: operations {} (acquires {}, failed acquires {}, \
         releases {}, losses reported {}), faults injected {faults} {injected:?}, violations {}, \
         unprotected windows {}, leaked nodes {}, leaked watches {}",
        started.elapsed().as_secs(),
        report.acquires_invoked + report.releases,
        report.acquires,
        report.acquire_failures,
        report.releases,
        report.losses,
        report.violations.len(),
        report.unprotected.len(),
        leaked_nodes.len(),
        leaked_watches.len(),
    ));
    report.assert_ok();
    assert!(leaked_nodes.is_empty(), "leaked nodes: {leaked_nodes:?}");
    assert!(
        leaked_watches.is_empty(),
        "leaked watches: {leaked_watches:?}"
    );
    assert!(faults > 0, "no fault was injected");
    assert!(
        report.acquires > 100,
        "too little traffic: {}",
        report.summary()
    );
}
