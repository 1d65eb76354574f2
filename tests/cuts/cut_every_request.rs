//! The adversary made systematic on ZooKeeper: every protocol — mutex acquire and release, the
//! hand-over to a waiter, read and write locks, a semaphore lease, a leader's election — run
//! once per request boundary k, cut there, and judged by the history checker.
//!
//! A victim process (its own session, behind a fault-injecting proxy) runs the protocol: take,
//! hold a moment (stopping at once when told the hold is lost), release. The proxy lets the
//! server apply the victim's k-th request and withholds the reply, then
//! - `Reset`: resets the connection (the client reconnects at once and carries on);
//! - `Cancel`: cuts the victim off, and the victim's future is dropped while it waits;
//! - `Kill`: cuts the victim off for good, as a killed process (its session expires).
//!
//! Then another process takes the same lock. The checker decides: no two believed holders at
//! any moment (a hold counts from its grant to its release or its reported loss), tokens
//! strictly increasing in grant order, and nothing stuck once the victim's session ended (the
//! other process gets the lock within the session timeout, and no contender node is left).
//!
//! k runs over every request the protocol sends (counted on an uncut run). In CI each k gets
//! one kind of cut, rotating;
//! `ZKLOCK_CUTS=all cargo test --test cuts -- cut_every_request::` runs every
//! kind at every k (scripts/cut-sweep).

use crate::common;
use crate::cuts;

use std::time::Duration;

use cuts::{
    assert_history_ok, drop_victim_when_stuck, hold_first, release_first, sweep, take_hold_release,
    Cut, Protocol, HOLD, WAIT,
};
use zklock::LockManager;
use zklock_testkit::{AfterDrop, History, Proxy, ZkServer};

/// Every request opcode of ZooKeeper's protocol a lock client sends (not pings, not the
/// session's own set-watches on reconnect): what k counts.
const OPS: [i32; 19] = [
    1, 2, 3, 4, 5, 6, 8, 9, 12, 13, 14, 15, 17, 18, 19, 20, 21, 22, 106,
];
const SESSION: Duration = Duration::from_secs(4);

/// The contender nodes left anywhere under the namespace for `key`.
async fn nodes_left(m: &LockManager, key: &str) -> Vec<String> {
    common::tree(m, "/")
        .await
        .into_iter()
        .filter(|p| p.contains(key) && p.rsplit('/').next().is_some_and(|n| n.starts_with("_c_")))
        .collect()
}

/// One run of `protocol` on `key`, by a victim behind a proxy that cuts after its `k`-th
/// request (`None`: no cut); returns how many requests the victim sent.
async fn run_once(zk: &ZkServer, protocol: Protocol, key: &str, cut: Option<(u64, Cut)>) -> u64 {
    let connect = zk.connect_string();
    let history = History::new();
    let other = common::manager(&connect).await;
    let proxy = Proxy::start(&connect).unwrap();
    let victim = common::manager_with(&proxy.connect_string(), SESSION).await;
    let before: u64 = OPS.iter().map(|op| proxy.requests_with(*op)).sum();

    // The hand-over: the other process holds first, and lets go once the victim queued.
    let first = if protocol == Protocol::Handover {
        Some(hold_first(&history, &other, key).await)
    } else {
        None
    };
    if let Some((k, how)) = cut {
        let after = match how {
            Cut::Reset => AfterDrop::Reset,
            Cut::Cancel | Cut::Kill => AfterDrop::ResetAndBlackhole,
        };
        proxy.drop_reply_to_nth_with(&OPS, k, after);
    }
    let victim_rec = history.recorder("victim");
    let run = {
        let (victim, key, rec) = (victim.clone(), key.to_string(), victim_rec.clone());
        tokio::spawn(async move {
            take_hold_release(protocol, &victim, &key, &rec, false, HOLD).await;
            victim.flush().await;
        })
    };
    if let Some(first) = first {
        // Released once the victim queued, or after a while if its create never got there.
        let path = other.path_of(key).unwrap();
        let _ = tokio::time::timeout(
            Duration::from_secs(2),
            common::until_children(&other, &path, 2),
        )
        .await;
        release_first(first, key).await;
    }
    match cut.map(|(_, how)| how) {
        // Cut off for good, the victim waits for a reply that never comes: its future is
        // dropped wherever it waits.
        Some(Cut::Cancel) | Some(Cut::Kill) => {
            drop_victim_when_stuck(run, Duration::from_secs(3)).await
        }
        _ => run.await.expect("the victim's task"),
    }
    let sent: u64 = OPS.iter().map(|op| proxy.requests_with(*op)).sum::<u64>() - before;
    match cut.map(|(_, how)| how) {
        Some(Cut::Kill) => {
            // The process is gone: nothing of it runs, and its session ends on the server.
            drop(victim);
            std::mem::forget(proxy);
            history.crashed("victim");
        }
        _ => {
            proxy.heal();
            victim.flush().await;
        }
    }

    // Another process takes the lock: within the session timeout of the victim's end at most.
    let other_rec = history.recorder("other");
    tokio::time::timeout(
        WAIT + SESSION,
        take_hold_release(protocol, &other, key, &other_rec, true, Duration::ZERO),
    )
    .await
    .unwrap_or_else(|_| panic!("{protocol:?} stuck after a cut {cut:?}"));
    other.flush().await;
    assert_history_ok(&history, protocol, cut);
    // Nothing left once every session that could hold a node has let go or ended.
    common::eventually(
        &format!("no contender node of {key} left ({protocol:?}, cut {cut:?})"),
        SESSION * 3,
        || async { nodes_left(&other, key).await.is_empty() },
    )
    .await;
    sent
}

/// Sweeps `protocol` on a server of its own.
async fn sweep_zookeeper(protocol: Protocol, offset: usize) {
    let zk = common::server();
    sweep(protocol, offset, false, |key, cut| {
        let zk = &zk;
        async move { run_once(zk, protocol, &key, cut).await }
    })
    .await;
}

cuts::sweep_tests!(sweep_zookeeper {
    mutex_cut_at_every_request: Mutex, 0;
    handover_cut_at_every_request: Handover, 1;
    read_lock_cut_at_every_request: Read, 2;
    write_lock_cut_at_every_request: Write, 0;
    semaphore_cut_at_every_request: Semaphore, 1;
    leader_cut_at_every_request: Leader, 2;
});
