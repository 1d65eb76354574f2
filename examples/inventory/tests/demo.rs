//! The anti-oversell demo, small: real ZooKeeper, real Redis, real PostgreSQL, real etcd,
//! instances as real processes.
//!
//! - With the lock, on ZooKeeper, Redis, PostgreSQL and etcd, nothing is oversold, and since demand exceeds
//!   stock, all stock is sold.
//! - In the pause scenario, on each backend, the next holder gets in while the holder is
//!   frozen past its session timeout or lease, and the holder's stale write is refused by the
//!   fence in the store.
//! - Each instance serves zklock's metrics on `/metrics`; the demo scrapes them after each
//!   locked run, and what they count agrees with what the clients saw.
//! - The fence itself (zklock's, through the store): tokens order by (zxid, local) exactly,
//!   also where a double could not tell two zxids apart.

use std::collections::HashMap;
use std::process::Command;
use std::time::Instant;

use zklock::fence::Fenced;
use zklock::FencingToken;
use zklock_inventory::store::{lock_resource, Store, WriteOutcome};
use zklock_testkit::RedisServer;

/// Parses the `prefix key=value key=value ...` line of the demo's output that contains
/// `with` (e.g. ` mode=lock backend=zk `).
fn machine_line(stdout: &str, prefix: &str, with: &str) -> HashMap<String, String> {
    let line = stdout
        .lines()
        .filter(|l| l.starts_with(prefix))
        .find(|l| l.contains(with))
        .unwrap_or_else(|| panic!("no {prefix:?} line with {with:?} in:\n{stdout}"));
    line[prefix.len()..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn num(fields: &HashMap<String, String>, key: &str) -> i64 {
    fields[key]
        .parse()
        .unwrap_or_else(|e| panic!("{key}={}: {e}", fields[key]))
}

#[test]
fn small_demo_sells_exactly_the_stock_with_the_lock_and_fences_the_paused_holder_on_every_backend()
{
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_zklock-inventory"))
        .args(["demo", "--no-progress", "--pause"])
        .args(["--instances", "3", "--clients", "24", "--skus", "3"])
        .args(["--stock", "20", "--demand", "3", "--session-timeout", "2s"])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    eprintln!("demo took {:.1} s", started.elapsed().as_secs_f64());
    assert!(output.status.success(), "demo failed: {}", output.status);

    // The last lines are the machine-readable summaries of the locked runs, one per backend.
    let last: Vec<&str> = stdout.lines().rev().take(5).collect();
    assert!(
        last.iter()
            .all(|l| l.starts_with("inventory: mode=lock backend=")),
        "last lines: {last:?}"
    );
    assert!(last[0].contains(" backend=mysql "), "{last:?}");
    assert!(last[1].contains(" backend=etcd "), "{last:?}");
    assert!(last[2].contains(" backend=postgres "), "{last:?}");
    assert!(last[3].contains(" backend=redis "), "{last:?}");
    assert!(last[4].contains(" backend=zk "), "{last:?}");

    let nolock = machine_line(&stdout, "inventory: ", " mode=nolock ");
    assert_eq!(num(&nolock, "initial"), 60);
    for backend in ["zk", "redis", "postgres", "etcd", "mysql"] {
        let lock = machine_line(
            &stdout,
            "inventory: ",
            &format!(" mode=lock backend={backend} "),
        );
        assert_eq!(num(&lock, "instances"), 3);
        assert_eq!(num(&lock, "initial"), 60);
        assert!(num(&lock, "orders") > num(&lock, "initial"), "{lock:?}");
        assert_eq!(num(&lock, "oversold"), 0, "{lock:?}");
        assert_eq!(num(&lock, "sold"), num(&lock, "initial"), "{lock:?}");
        assert_eq!(num(&lock, "left"), 0, "{lock:?}");
        // Without the lock the same run reports its figures too (how much it oversells
        // varies).
        assert_eq!(num(&nolock, "orders"), num(&lock, "orders"));

        // zklock's own metrics, scraped from the instances' /metrics: every order that was
        // sold went through a granted acquire (answered out-of-stock ones did too), each
        // grant either a local handoff or the backend's.
        let metrics = machine_line(
            &stdout,
            "inventory-metrics: ",
            &format!("backend={backend} "),
        );
        let ok = num(&metrics, "acquires_ok");
        assert!(ok >= num(&lock, "sold"), "{metrics:?}");
        assert_eq!(
            num(&metrics, "local_handoffs") + num(&metrics, "backend_grants"),
            ok,
            "{metrics:?}"
        );
        assert_eq!(num(&metrics, "holds_lost"), 0, "{metrics:?}");
        assert_ne!(metrics["wait_p99_le_ms"], "-", "{metrics:?}");

        let pause = machine_line(&stdout, "inventory-pause: ", &format!("backend={backend} "));
        assert_eq!(pause["stale_write"], "rejected", "{pause:?}");
        assert_eq!(pause["next_holder"], "sold", "{pause:?}");
        assert_eq!(num(&pause, "sold"), 1, "{pause:?}");
        assert_eq!(num(&pause, "oversold"), 0, "{pause:?}");
        assert!(
            num(&pause, "winner_token") > num(&pause, "stale_token"),
            "{pause:?}"
        );
    }
    assert!(stdout.contains("REJECTED by the fence"), "{stdout}");
}

#[test]
fn the_fence_refuses_older_tokens_exactly() {
    let redis = RedisServer::start().expect("redis-server");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store = Store::connect(&redis.url()).await.unwrap();
        store.reset(&[("7".to_string(), 10)]).await.unwrap();
        let write = |stock: i64, token: Option<FencingToken>| {
            let store = store.clone();
            async move {
                let writer = token.map(|t| Fenced::new(store.fence(), lock_resource("7"), t));
                store.write("7", stock, "o", writer.as_ref()).await.unwrap()
            }
        };
        let t = FencingToken::new;
        // 2^53 and 2^53 + 1 are the same double: a naive Lua comparison would let the older pass.
        let big = 1i64 << 53;
        let accepted = [
            t(5, 0),
            t(5, 0), // the same hold writing again
            t(5, 1), // a local handoff
            t(0xffff_ffff, 0),
            t(0x1_0000_0000, 0), // the next epoch
            t(big, 0),
            t(big + 1, 0),
            t(big + 1, 2),
        ];
        for (i, token) in accepted.into_iter().enumerate() {
            assert_eq!(
                write(9 - i as i64, Some(token)).await,
                WriteOutcome::Written,
                "{token:?}"
            );
        }
        let last = t(big + 1, 2);
        for stale in [t(big + 1, 1), t(big, 7), t(5, 0), t(0x1_0000_0000, 9)] {
            assert_eq!(
                write(0, Some(stale)).await,
                WriteOutcome::Stale { last },
                "{stale:?}"
            );
        }
        assert_eq!(store.last_token("7").await.unwrap(), Some(last));
        // A writer fenced on another lock's resource is refused before Redis.
        let other = Fenced::new(store.fence(), lock_resource("8"), t(big + 9, 0));
        let err = store.write("7", 0, "o", Some(&other)).await.unwrap_err();
        assert!(
            err.to_string().contains("fence it with its own lock"),
            "{err}"
        );
        assert_eq!(store.stock("7").await.unwrap(), Some(2));
        assert_eq!(store.sold("7").await.unwrap(), accepted.len() as i64);
        // Without a token (the no-lock mode) nothing is checked.
        assert_eq!(write(1, None).await, WriteOutcome::Written);
        assert_eq!(store.stock("7").await.unwrap(), Some(1));
    });
}

/// `--modes redis-sentinel`: the locked inventory on Redis under Sentinel, its primary failed
/// over (`SENTINEL FAILOVER`) while the orders flow. Nothing is oversold, the whole stock is
/// sold, every instance learns of the failover, and the output says what it cost.
#[test]
fn a_sentinel_failover_in_the_middle_of_the_orders_oversells_nothing() {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_zklock-inventory"))
        .args(["demo", "--no-progress", "--modes", "redis-sentinel"])
        .args(["--instances", "3", "--clients", "24", "--skus", "3"])
        .args(["--stock", "40", "--demand", "3", "--session-timeout", "2s"])
        .args(["--failover-span", "6s"])
        .output()
        .expect("run the demo");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    eprintln!("demo took {:.1} s", started.elapsed().as_secs_f64());
    assert!(output.status.success(), "demo failed: {}", output.status);

    let last = stdout.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("inventory: mode=lock backend=redis-sentinel "),
        "{last}"
    );
    let lock = machine_line(&stdout, "inventory: ", " backend=redis-sentinel ");
    assert_eq!(num(&lock, "instances"), 3);
    assert_eq!(num(&lock, "initial"), 120);
    assert_eq!(num(&lock, "oversold"), 0, "{lock:?}");
    assert_eq!(num(&lock, "sold"), num(&lock, "initial"), "{lock:?}");
    assert_eq!(num(&lock, "left"), 0, "{lock:?}");
    // The failover happened and every instance saw it (the Sentinels' +switch-master, a
    // -READONLY reply or the break of a connection); its figures are reported.
    assert_eq!(num(&lock, "failovers_seen"), 3, "{lock:?}");
    assert!(num(&lock, "failover_ms") > 0, "{lock:?}");
    for field in ["fenced", "holds_lost_failover", "stall_ms", "sold_after"] {
        assert!(num(&lock, field) >= 0, "{field}: {lock:?}");
    }
    assert!(stdout.contains("failover: holds lost"), "{stdout}");
    assert!(stdout.contains("SENTINEL FAILOVER at"), "{stdout}");
}
