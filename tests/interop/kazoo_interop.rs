//! Interop with kazoo (Python, Debian's `python3-kazoo`) on the same lock path, both ways:
//! zklock takes kazoo's `Lock`, `ReadLock` and `WriteLock` nodes for contenders, ordered with
//! its own by sequence number; kazoo sees zklock's nodes through the `extra_lock_patterns` that
//! docs/interop-kazoo.md gives (the constants below); a node of neither kind on a lock path is a
//! clear error rather than a lock silently taken beside it.

use crate::common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use zklock::Error;
use zklock_testkit::{now_epoch_ms, KazooEvent, KazooPeer};

/// kazoo's `Lock` and `WriteLock`: see zklock's mutex, reader and writer nodes (docs/interop-kazoo.md).
const LOCK_PATTERNS: &[&str] = &["-lock-", "__READ__", "__WRIT__"];
/// kazoo's `ReadLock`: see zklock's mutex and writer nodes, not its readers.
const READ_PATTERNS: &[&str] = &["-lock-", "__WRIT__"];

/// How long a lock that must wait is watched not to be granted (after its node is seen queued).
const STILL_WAITING: Duration = Duration::from_millis(700);

fn kazoo(zk: &ZkServer) -> KazooPeer {
    KazooPeer::spawn(&zk.connect_string()).expect("start the kazoo peer")
}

/// The peer's next event, which must be `event` of `name`; its time.
fn expect(peer: &mut KazooPeer, event: &str, name: &str) -> u64 {
    let got = tokio::task::block_in_place(|| peer.next_event(Duration::from_secs(30))).unwrap();
    assert_eq!(
        (got.event.as_str(), got.name.as_str()),
        (event, name),
        "kazoo said {got:?}"
    );
    got.at_ms
}

/// The peer releases `held`, which lets its waiting `waiter` in: both events come, in whichever
/// order (the peer's two threads print them: the grant may be printed before the release
/// returns), and the grant comes after the release was asked for.
fn release_lets_in(peer: &mut KazooPeer, held: &str, waiter: &str) {
    let asked = now_epoch_ms();
    peer.release(held).unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let got = tokio::task::block_in_place(|| peer.next_event(Duration::from_secs(30))).unwrap();
        seen.push((got.event.clone(), got.name.clone(), got.at_ms));
    }
    let has = |event: &str, name: &str| seen.iter().find(|(e, n, _)| e == event && n == name);
    assert!(has("released", held).is_some(), "kazoo said {seen:?}");
    let (_, _, granted_at) =
        has("acquired", waiter).unwrap_or_else(|| panic!("kazoo said {seen:?}"));
    assert!(
        *granted_at >= asked,
        "kazoo granted {waiter} at {granted_at}, before {held} was released at {asked}"
    );
}

/// No event from the peer for [`STILL_WAITING`]: its pending acquire still waits.
fn still_waiting(peer: &mut KazooPeer, what: &str) {
    let got: Option<KazooEvent> =
        tokio::task::block_in_place(|| peer.event_within(STILL_WAITING)).unwrap();
    assert!(got.is_none(), "{what}: kazoo said {got:?}");
}

/// The bug this file was written for: a plain kazoo `Lock` (no extra patterns) holds, and
/// zklock used to take the lock beside it at once, both believing they held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zklock_waits_while_a_plain_kazoo_lock_holds() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/kz2";
    let mut peer = kazoo(&zk);
    peer.acquire("k", "lock", path, &[]).unwrap();
    expect(&mut peer, "acquired", "k");
    let mutex = m.mutex_at_path(path).unwrap();
    assert!(
        mutex.try_lock().await.unwrap().is_none(),
        "zklock took a lock kazoo holds"
    );
    // What `zklock exec --path /kz2 --timeout 1s` does.
    match mutex.lock_timeout(Duration::from_secs(1)).await {
        Err(Error::Timeout { .. }) => {}
        other => panic!("zklock must wait for kazoo's holder: {other:?}"),
    }
    let waiter = tokio::spawn(async move {
        let guard = mutex.lock().await.unwrap();
        (now_epoch_ms(), guard)
    });
    until_children(&m, path, 2).await;
    assert!(
        !waiter.is_finished(),
        "zklock was granted while kazoo holds"
    );
    peer.release("k").unwrap();
    let released_at = expect(&mut peer, "released", "k");
    let (got_at, guard) = waiter.await.unwrap();
    assert!(
        got_at >= released_at,
        "zklock got the lock at {got_at}, before kazoo released at {released_at}"
    );
    guard.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_lock_with_the_documented_patterns_waits_while_zklock_holds() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/interop-kazoo/mutex";
    let guard = m.mutex_at_path(path).unwrap().lock().await.unwrap();
    let mut peer = kazoo(&zk);
    peer.acquire("k", "lock", path, LOCK_PATTERNS).unwrap();
    until_children(&m, path, 2).await;
    still_waiting(&mut peer, "kazoo's Lock was granted while zklock holds");
    let released_at = now_epoch_ms();
    guard.release().await.unwrap();
    let acquired_at = expect(&mut peer, "acquired", "k");
    assert!(
        acquired_at >= released_at,
        "kazoo got the lock at {acquired_at} while zklock held it until {released_at}"
    );
    // The same with a kazoo WriteLock.
    peer.release("k").unwrap();
    expect(&mut peer, "released", "k");
    let guard = m.mutex_at_path(path).unwrap().lock().await.unwrap();
    peer.acquire("w", "write", path, LOCK_PATTERNS).unwrap();
    until_children(&m, path, 2).await;
    still_waiting(
        &mut peer,
        "kazoo's WriteLock was granted while zklock holds",
    );
    guard.release().await.unwrap();
    expect(&mut peer, "acquired", "w");
}

/// Readers of both clients share; a writer of either excludes every other holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_and_zklock_readers_share_and_writers_exclude_everyone() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/interop-kazoo/rw";
    let rw = m.rwlock_at_path(path).unwrap();
    let mut peer = kazoo(&zk);

    // A zklock reader and a kazoo reader hold together.
    let read = rw.read().await.unwrap();
    peer.acquire("r1", "read", path, READ_PATTERNS).unwrap();
    expect(&mut peer, "acquired", "r1");
    assert!(read.is_held());
    // A kazoo writer waits for both; a zklock reader queued behind it waits too.
    peer.acquire("w1", "write", path, LOCK_PATTERNS).unwrap();
    until_children(&m, path, 3).await;
    assert!(rw.try_read().await.unwrap().is_none(), "read past a writer");
    still_waiting(&mut peer, "kazoo's writer was granted beside two readers");
    read.release().await.unwrap();
    still_waiting(
        &mut peer,
        "kazoo's writer was granted beside kazoo's reader",
    );
    release_lets_in(&mut peer, "r1", "w1");
    // kazoo's writer holds: zklock neither reads nor writes.
    assert!(
        rw.try_read().await.unwrap().is_none(),
        "zklock read in kazoo's write"
    );
    assert!(
        rw.try_write().await.unwrap().is_none(),
        "zklock wrote in kazoo's write"
    );
    peer.release("w1").unwrap();
    expect(&mut peer, "released", "w1");

    // zklock's writer holds: kazoo's reader waits; then a kazoo writer waits for that reader.
    // (The writer queues only once the reader holds: kazoo 2.8's ReadLock, woken, waits for
    // the last writer in the queue, even one behind it, which waits for it: kazoo's own
    // deadlock, its issue #649, whoever's writers they are.)
    let write = rw.write().await.unwrap();
    peer.acquire("r2", "read", path, READ_PATTERNS).unwrap();
    until_children(&m, path, 2).await;
    still_waiting(&mut peer, "kazoo read inside zklock's write");
    let released_at = now_epoch_ms();
    write.release().await.unwrap();
    let read_at = expect(&mut peer, "acquired", "r2");
    assert!(
        read_at >= released_at,
        "kazoo read at {read_at} while zklock wrote until {released_at}"
    );
    peer.acquire("w2", "write", path, LOCK_PATTERNS).unwrap();
    until_children(&m, path, 2).await;
    still_waiting(
        &mut peer,
        "kazoo's writer was granted beside kazoo's reader",
    );
    release_lets_in(&mut peer, "r2", "w2");
    peer.release("w2").unwrap();
    expect(&mut peer, "released", "w2");

    // A kazoo reader holds: a zklock reader shares, a zklock writer does not.
    peer.acquire("r3", "read", path, READ_PATTERNS).unwrap();
    expect(&mut peer, "acquired", "r3");
    let shared = rw.try_read().await.unwrap();
    assert!(shared.is_some(), "zklock's reader must share with kazoo's");
    assert!(
        rw.try_write().await.unwrap().is_none(),
        "zklock wrote beside kazoo's reader"
    );
    shared.unwrap().release().await.unwrap();
    peer.release("r3").unwrap();
    expect(&mut peer, "released", "r3");
}

/// Waiters of both clients queued alternately are granted in the order they queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kazoo_and_zklock_waiters_are_granted_in_queue_order() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/interop-kazoo/fifo";
    let first = m.mutex_at_path(path).unwrap().lock().await.unwrap();
    let mut peer = kazoo(&zk);
    // (who, granted at, released at), as each holder saw it.
    let holds = Arc::new(Mutex::new(Vec::<(String, u64, u64)>::new()));
    let mut zklock_waiters = vec![];
    for (i, who) in ["k1", "z1", "k2", "z2"].into_iter().enumerate() {
        if who.starts_with('k') {
            peer.acquire(who, "lock", path, LOCK_PATTERNS).unwrap();
        } else {
            let waiter = manager(&zk.connect_string()).await;
            let mutex = waiter.mutex_at_path(path).unwrap();
            let holds = holds.clone();
            zklock_waiters.push(tokio::spawn(async move {
                let guard = mutex.lock().await.unwrap();
                let got = now_epoch_ms();
                tokio::time::sleep(Duration::from_millis(50)).await;
                holds
                    .lock()
                    .unwrap()
                    .push((who.into(), got, now_epoch_ms()));
                guard.release().await.unwrap();
                drop(waiter);
            }));
        }
        // The next one queues only once this one's node is there.
        until_children(&m, path, i + 2).await;
    }
    first.release().await.unwrap();
    for name in ["k1", "k2"] {
        let got = expect(&mut peer, "acquired", name);
        peer.release(name).unwrap();
        let released = expect(&mut peer, "released", name);
        holds.lock().unwrap().push((name.into(), got, released));
    }
    for w in zklock_waiters {
        w.await.unwrap();
    }
    let mut holds = holds.lock().unwrap().clone();
    holds.sort_by_key(|h| h.1);
    let order: Vec<&str> = holds.iter().map(|h| h.0.as_str()).collect();
    assert_eq!(order, ["k1", "z1", "k2", "z2"], "grants: {holds:?}");
    for pair in holds.windows(2) {
        assert!(pair[1].1 >= pair[0].2, "overlapping holds: {pair:?}");
    }
}

/// A child of a lock path that is neither Curator's (zklock's) nor kazoo's is a clear error
/// naming it, leaves nothing behind, and shows in what `zklock ls` lists.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_node_on_a_lock_path_is_a_clear_error() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let client = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    let path = m.path_of("sku_7").unwrap();
    let open = zklock::zookeeper_client::CreateMode::Persistent
        .with_acls(zklock::zookeeper_client::Acls::anyone_all());
    client.mkdir(&path, &open).await.unwrap();
    client
        .create(&format!("{path}/stranger-0000000001"), b"", &open)
        .await
        .unwrap();
    for acquire in ["mutex", "read", "write"] {
        let result = match acquire {
            "mutex" => m.try_lock("sku_7").await.map(drop),
            "read" => m.rwlock_at_path(&path).unwrap().try_read().await.map(drop),
            _ => m.rwlock_at_path(&path).unwrap().try_write().await.map(drop),
        };
        match result {
            Err(Error::InvalidArgument(msg)) => {
                assert!(msg.contains(&path), "{acquire}: {msg}");
                assert!(msg.contains("stranger-0000000001"), "{acquire}: {msg}");
            }
            other => panic!("{acquire} beside an unknown node: {other:?}"),
        }
    }
    m.flush().await;
    assert_eq!(children(&m, &path).await, ["stranger-0000000001"]);
    let listed = m.list("sku_").await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let nodes: Vec<&str> = listed[0].holders.iter().map(|h| h.node.as_str()).collect();
    assert_eq!(nodes, ["stranger-0000000001"]);
    assert_eq!(listed[0].holders[0].mode, "unknown");
}

/// A kazoo holder whose process dies: its session lives on in the server until it expires,
/// and zklock's waiter is not granted before; once it has expired (the server deletes kazoo's
/// ephemeral node), the waiter is granted, and no node of kazoo's is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kazoo_holder_whose_session_expires_hands_the_lock_on() {
    let zk = server();
    let m = manager(&zk.connect_string()).await;
    let path = "/kz-expires";
    let session = Duration::from_secs(2);
    let mut peer = KazooPeer::spawn_with_session(&zk.connect_string(), session).unwrap();
    peer.acquire("k", "lock", path, &[]).unwrap();
    expect(&mut peer, "acquired", "k");
    let mutex = m.mutex_at_path(path).unwrap();
    let waiting = tokio::spawn(async move {
        let g = mutex.lock_timeout(Duration::from_secs(30)).await;
        (g, std::time::Instant::now())
    });
    tokio::time::sleep(STILL_WAITING).await;
    assert!(!waiting.is_finished(), "granted while kazoo held");
    let killed = std::time::Instant::now();
    tokio::task::block_in_place(|| peer.kill()).unwrap();
    let (granted, at) = waiting.await.unwrap();
    let granted = granted.expect("granted once kazoo's session expired");
    let after = at.duration_since(killed);
    eprintln!("granted {after:?} after kazoo's process died (session {session:?})");
    assert!(
        after >= session / 2,
        "granted {after:?} after the kill: before kazoo's session could have expired"
    );
    let client = m
        .client::<zookeeper_client::Client>()
        .expect("a ZooKeeper manager");
    let children = client.list_children(path).await.unwrap();
    assert_eq!(children.len(), 1, "only zklock's node: {children:?}");
    assert!(!children[0].contains("__lock__"), "{children:?}");
    granted.release().await.unwrap();
}
