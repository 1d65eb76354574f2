//! The oversell problem in miniature, and zklock stopping it.
//!
//! Several "instances" (each its own ZooKeeper session, as separate processes would have)
//! sell from one shared stock: read the stock, check it, write it back. Without a
//! lock, two instances read the same stock and both sell: the stock goes negative. With
//! `with_lock("sku_{id}")` around read-check-write, it never does.
//!
//! Run it with `scripts/demo` (which installs ZooKeeper if missing), or with
//! `ZKLOCK_CONNECT=host:port cargo run --example oversell` against your own server.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zklock::LockManager;

const INSTANCES: usize = 4;
const CLIENTS_PER_INSTANCE: usize = 8;
const ORDERS_PER_CLIENT: usize = 10;
const SKUS: usize = 3;
const STOCK: i64 = 50;

/// The shared stock, read and written in separate steps, as with Redis GET and SET.
#[derive(Clone, Default)]
struct Store(Arc<std::sync::Mutex<HashMap<usize, i64>>>);

impl Store {
    async fn get(&self, sku: usize) -> i64 {
        tokio::task::yield_now().await; // a network round trip in real life
        self.0.lock().unwrap()[&sku]
    }

    async fn set(&self, sku: usize, value: i64) {
        tokio::task::yield_now().await;
        self.0.lock().unwrap().insert(sku, value);
    }
}

/// One order: read, check, (think), write. Returns whether it sold.
async fn place_order(store: &Store, sku: usize) -> bool {
    let stock = store.get(sku).await;
    if stock <= 0 {
        return false;
    }
    tokio::time::sleep(Duration::from_millis(1)).await; // pricing, payment, ...
    store.set(sku, stock - 1).await;
    true
}

struct Outcome {
    sold: u64,
    rejected: u64,
    left: i64,
    secs: f64,
}

async fn run(connect: &str, locked: bool) -> Outcome {
    let store = Store::default();
    for sku in 0..SKUS {
        store.set(sku, STOCK).await;
    }
    let sold = Arc::new(AtomicU64::new(0));
    let rejected = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let mut tasks = vec![];
    for instance in 0..INSTANCES {
        let manager = LockManager::connect(connect)
            .await
            .expect("connect to ZooKeeper");
        for client in 0..CLIENTS_PER_INSTANCE {
            let (manager, store, sold, rejected) = (
                manager.clone(),
                store.clone(),
                sold.clone(),
                rejected.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for n in 0..ORDERS_PER_CLIENT {
                    let sku = (instance + client + n) % SKUS;
                    let ok = if locked {
                        let key = format!("sku_{sku}");
                        manager
                            .with_lock(&key, place_order(&store, sku))
                            .await
                            .expect("lock")
                    } else {
                        place_order(&store, sku).await
                    };
                    let counter = if ok { &sold } else { &rejected };
                    counter.fetch_add(1, Ordering::Relaxed);
                }
            }));
        }
    }
    for t in tasks {
        t.await.unwrap();
    }
    let mut left = 0;
    for sku in 0..SKUS {
        left += store.get(sku).await;
    }
    Outcome {
        sold: sold.load(Ordering::Relaxed),
        rejected: rejected.load(Ordering::Relaxed),
        left,
        secs: started.elapsed().as_secs_f64(),
    }
}

#[tokio::main]
async fn main() {
    let (_server, connect) = common::zookeeper();
    let initial = STOCK * SKUS as i64;
    let demand = INSTANCES * CLIENTS_PER_INSTANCE * ORDERS_PER_CLIENT;
    println!("{INSTANCES} instances x {CLIENTS_PER_INSTANCE} clients, {demand} orders for {initial} items over {SKUS} SKUs\n");
    println!("| mode           | initial | sold | left | oversold | rejected | orders/s |");
    println!("|----------------|---------|------|------|----------|----------|----------|");
    let mut last = None;
    for locked in [false, true] {
        let o = run(&connect, locked).await;
        // Oversold: sales that the stock does not account for (the same item sold twice).
        let oversold = o.sold as i64 - (initial - o.left);
        let mode = if locked { "with lock" } else { "without lock" };
        println!(
            "| {mode:<14} | {initial:>7} | {:>4} | {:>4} | {:>8} | {:>8} | {:>8.0} |",
            o.sold,
            o.left,
            oversold,
            o.rejected,
            demand as f64 / o.secs
        );
        last = Some((locked, o, oversold));
    }
    let (_, o, oversold) = last.unwrap();
    println!(
        "\noversell: mode=lock initial={initial} sold={} left={} oversold={oversold} orders={demand} instances={INSTANCES}",
        o.sold, o.left
    );
}
