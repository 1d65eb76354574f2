//! The test kit's replicated Redis against Debian's redis-server and redis-sentinel: a primary
//! with replicas and Sentinels (replication, failover on a killed primary and on request), and a
//! Redis Cluster (every slot served, a key's node, a replica's failover, a killed primary
//! replaced); smaller setups on a moved clock; cleanup on drop.

use std::io;
use std::time::{Duration, Instant};

use zklock_testkit::{RedisCluster, RedisReply, RedisSentinel, ServerClock};

fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

fn ok() -> RedisReply {
    RedisReply::Status("OK".into())
}

fn text(reply: io::Result<RedisReply>) -> Option<String> {
    reply.unwrap().text()
}

/// The end of every Sentinel's log, for a failure's message.
fn sentinel_logs(redis: &RedisSentinel) -> String {
    (0..redis.sentinel_addrs().len())
        .map(|j| {
            let log = std::fs::read_to_string(redis.sentinel_log_path(j)).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            format!(
                "--- Sentinel {j}:\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Fails when the primary that every Sentinel reported after a failover is not the one they
/// settle on: the Sentinels failed over a second time (as they did with `down-after` at
/// 1000 ms, see `RedisSentinelBuilder::down_after`), with their logs.
fn assert_not_moved(redis: &RedisSentinel, first: usize, settled: usize) {
    assert_eq!(
        settled,
        first,
        "the Sentinels moved the primary again\n{}",
        sentinel_logs(redis)
    );
}

/// What every Sentinel reports as the primary's address.
fn reported(redis: &RedisSentinel) -> Vec<String> {
    (0..redis.sentinel_addrs().len())
        .map(|j| {
            let reply = redis
                .sentinel_command(
                    j,
                    &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", redis.master_name()],
                )
                .unwrap();
            let items = reply.array().unwrap();
            format!("{}:{}", items[0].text().unwrap(), items[1].text().unwrap())
        })
        .collect()
}

#[test]
fn sentinels_watch_a_primary_whose_writes_reach_the_replicas() {
    let started = Instant::now();
    let redis = RedisSentinel::start().unwrap();
    eprintln!(
        "redis-sentinel: primary, 2 replicas and 3 Sentinels settled in {:?}",
        started.elapsed()
    );
    assert_eq!(redis.len(), 3);
    assert_eq!(redis.sentinel_addrs().len(), 3);
    assert_eq!(redis.master_name(), "zklock");
    assert_eq!(redis.down_after(), Duration::from_millis(2000));
    assert_eq!(redis.failover_timeout(), Duration::from_millis(3000));
    assert_eq!(redis.primary().unwrap(), 0);
    assert_eq!(reported(&redis), vec![redis.node_addr(0); 3]);
    assert_eq!(redis.role(0).as_deref(), Some("master"));
    assert_eq!(redis.role(1).as_deref(), Some("slave"));
    assert_eq!(redis.role(2).as_deref(), Some("slave"));

    // Both replicas acknowledged the write (WAIT on the writing connection)...
    let replies = redis
        .commands(0, &[&["SET", "k", "v1"], &["WAIT", "2", "5000"]])
        .unwrap();
    assert_eq!(replies, vec![ok(), RedisReply::Int(2)]);
    // ...and serve it; they refuse writes.
    for i in [1, 2] {
        assert_eq!(text(redis.command(i, &["GET", "k"])).as_deref(), Some("v1"));
        let refused = redis.command(i, &["SET", "k", "v2"]).unwrap_err();
        assert!(refused.to_string().starts_with("READONLY"), "{refused}");
    }
    assert_eq!(
        redis.command(0, &["GET", "missing"]).unwrap(),
        RedisReply::Nil
    );
}

#[test]
fn a_killed_primary_is_replaced_within_seconds_and_comes_back_as_a_replica() {
    let mut redis = RedisSentinel::start().unwrap();
    let replies = redis
        .commands(0, &[&["SET", "before", "1"], &["WAIT", "2", "5000"]])
        .unwrap();
    assert_eq!(replies[1].int(), Some(2));

    let killed = Instant::now();
    let old = redis.kill_primary().unwrap();
    assert_eq!(old, 0);
    assert_eq!(redis.pid(old), None);
    let new = redis
        .wait_for_new_primary(old, Duration::from_secs(20))
        .unwrap();
    eprintln!(
        "redis-sentinel: every Sentinel reports the new primary {new} {:?} after the primary was \
         killed (down-after {:?})",
        killed.elapsed(),
        redis.down_after()
    );
    assert_ne!(new, old);
    assert_eq!(reported(&redis), vec![redis.node_addr(new); 3]);
    assert_eq!(redis.primary().unwrap(), new);
    assert_eq!(redis.role(new).as_deref(), Some("master"));
    // It has what the old primary had, and takes writes.
    assert_eq!(
        text(redis.command(new, &["GET", "before"])).as_deref(),
        Some("1")
    );
    assert_eq!(redis.command(new, &["SET", "after", "2"]).unwrap(), ok());

    // The old primary comes back as a replica of the new one and gets the writes.
    let restarted = Instant::now();
    redis.restart(old).unwrap();
    let settled = redis.wait_settled(Duration::from_secs(20)).unwrap();
    eprintln!(
        "redis-sentinel: the old primary restarted and attached as a replica in {:?}",
        restarted.elapsed()
    );
    assert_not_moved(&redis, new, settled);
    assert_eq!(redis.role(old).as_deref(), Some("slave"));
    let replies = redis
        .commands(new, &[&["SET", "after", "3"], &["WAIT", "2", "5000"]])
        .unwrap();
    assert_eq!(replies[1].int(), Some(2));
    assert_eq!(
        text(redis.command(old, &["GET", "after"])).as_deref(),
        Some("3")
    );
    // It got what it missed as well, by a full resync.
    assert_eq!(
        text(redis.command(old, &["GET", "before"])).as_deref(),
        Some("1")
    );
}

#[test]
fn a_requested_failover_moves_the_primary_and_the_old_one_follows() {
    let redis = RedisSentinel::start().unwrap();
    redis.command(0, &["SET", "k", "v"]).unwrap();
    let asked = Instant::now();
    let new = redis.failover().unwrap();
    eprintln!(
        "redis-sentinel: SENTINEL FAILOVER to node {new} reported everywhere in {:?}",
        asked.elapsed()
    );
    assert_ne!(new, 0);
    assert_eq!(redis.primary().unwrap(), new);
    // The Sentinels turn the old primary into a replica of the new one, in their own time.
    let settling = Instant::now();
    let settled = redis.wait_settled(Duration::from_secs(40)).unwrap();
    eprintln!(
        "redis-sentinel: the old primary turned into a replica {:?} after the failover",
        settling.elapsed()
    );
    assert_not_moved(&redis, new, settled);
    assert_eq!(redis.role(0).as_deref(), Some("slave"));
    let replies = redis
        .commands(new, &[&["SET", "k", "w"], &["WAIT", "2", "5000"]])
        .unwrap();
    assert_eq!(replies, vec![ok(), RedisReply::Int(2)]);
    assert_eq!(text(redis.command(0, &["GET", "k"])).as_deref(), Some("w"));
}

#[test]
fn a_paused_primary_is_failed_over() {
    let redis = RedisSentinel::start().unwrap();
    redis.pause(0).unwrap();
    assert!(redis.is_paused(0));
    let paused = Instant::now();
    let new = redis
        .wait_for_new_primary(0, Duration::from_secs(20))
        .unwrap();
    eprintln!(
        "redis-sentinel: new primary {:?} after the primary was paused",
        paused.elapsed()
    );
    assert_ne!(new, 0);
    redis.resume(0).unwrap();
    // Resumed, it still says it is a primary (and takes writes that go nowhere) until a Sentinel
    // turns it into a replica.
    assert_eq!(redis.role(0).as_deref(), Some("master"));
    let resumed = Instant::now();
    let settled = redis.wait_settled(Duration::from_secs(40)).unwrap();
    eprintln!(
        "redis-sentinel: the resumed old primary turned into a replica {:?} later",
        resumed.elapsed()
    );
    assert_not_moved(&redis, new, settled);
    assert_eq!(redis.role(0).as_deref(), Some("slave"));
}

#[test]
fn dropping_the_sentinel_setup_kills_everything_and_removes_its_files() {
    let redis = RedisSentinel::start().unwrap();
    let pids: Vec<u32> = (0..redis.len()).map(|i| redis.pid(i).unwrap()).collect();
    let log = redis.sentinel_log_path(0).to_path_buf();
    let sentinel_log = std::fs::read_to_string(&log).unwrap();
    assert!(
        sentinel_log.contains("+monitor master zklock"),
        "{sentinel_log}"
    );
    redis.pause(1).unwrap();
    drop(redis);
    assert!(pids.iter().all(|&pid| !process_alive(pid)));
    assert!(!log.exists());
}

#[test]
fn a_cluster_serves_every_slot_and_routes_keys() {
    let started = Instant::now();
    let cluster = RedisCluster::start().unwrap();
    eprintln!(
        "redis-cluster: 3 primaries with a replica each serve every slot after {:?}",
        started.elapsed()
    );
    assert_eq!(cluster.len(), 6);
    assert_eq!(cluster.node_timeout(), Duration::from_millis(1000));
    for i in 0..6 {
        let info = text(cluster.command(i, &["CLUSTER", "INFO"])).unwrap();
        assert!(info.contains("cluster_state:ok"), "{info}");
        assert!(info.contains("cluster_slots_assigned:16384"), "{info}");
        assert!(info.contains("cluster_slots_ok:16384"), "{info}");
        assert!(info.contains("cluster_known_nodes:6"), "{info}");
        assert!(info.contains("cluster_size:3"), "{info}");
    }
    let primaries = cluster.primaries().unwrap();
    let replicas = cluster.replicas().unwrap();
    assert_eq!(primaries.len(), 3);
    assert_eq!(replicas.len(), 3);
    // Each primary has exactly one replica.
    let mut followed: Vec<usize> = replicas
        .iter()
        .map(|&r| cluster.primary_of(r).unwrap().unwrap())
        .collect();
    followed.sort_unstable();
    assert_eq!(followed, primaries);
    for &p in &primaries {
        assert_eq!(cluster.primary_of(p).unwrap(), None);
        assert_eq!(cluster.role(p).as_deref(), Some("master"));
    }

    // CLUSTER SLOTS covers 0..=16383 once.
    let slots = cluster.command(0, &["CLUSTER", "SLOTS"]).unwrap();
    let mut ranges: Vec<(i64, i64)> = slots
        .array()
        .unwrap()
        .iter()
        .map(|r| {
            let r = r.array().unwrap();
            (r[0].int().unwrap(), r[1].int().unwrap())
        })
        .collect();
    ranges.sort_unstable();
    assert_eq!(ranges.first().unwrap().0, 0);
    assert_eq!(ranges.last().unwrap().1, 16383);
    assert!(ranges.windows(2).all(|w| w[0].1 + 1 == w[1].0));

    // The key's node takes it; another primary redirects there.
    let key = "lock:orders";
    let owner = cluster.node_for_key(key).unwrap();
    assert!(primaries.contains(&owner));
    assert_eq!(
        cluster.slot(key).unwrap(),
        cluster.slot("{lock:orders}.x").unwrap()
    );
    assert_eq!(cluster.command(owner, &["SET", key, "me"]).unwrap(), ok());
    let elsewhere = primaries.iter().find(|&&p| p != owner).unwrap();
    let moved = cluster.command(*elsewhere, &["GET", key]).unwrap_err();
    let expected = format!(
        "MOVED {} {}",
        cluster.slot(key).unwrap(),
        cluster.addr(owner)
    );
    assert_eq!(moved.to_string(), expected);
}

#[test]
fn a_replica_failover_makes_it_a_primary() {
    let cluster = RedisCluster::start().unwrap();
    let key = "fenced";
    let owner = cluster.node_for_key(key).unwrap();
    let replies = cluster
        .commands(owner, &[&["SET", key, "v"], &["WAIT", "1", "5000"]])
        .unwrap();
    assert_eq!(replies[1].int(), Some(1));
    let replica = *cluster
        .replicas()
        .unwrap()
        .iter()
        .find(|&&r| cluster.primary_of(r).unwrap() == Some(owner))
        .unwrap();

    let asked = Instant::now();
    cluster.failover(replica).unwrap();
    eprintln!(
        "redis-cluster: CLUSTER FAILOVER done and seen everywhere in {:?}",
        asked.elapsed()
    );
    assert_eq!(cluster.role(replica).as_deref(), Some("master"));
    assert_eq!(cluster.role(owner).as_deref(), Some("slave"));
    assert!(cluster.primaries().unwrap().contains(&replica));
    assert!(cluster.replicas().unwrap().contains(&owner));
    assert_eq!(cluster.primary_of(owner).unwrap(), Some(replica));
    assert_eq!(cluster.node_for_key(key).unwrap(), replica);
    assert_eq!(
        text(cluster.command(replica, &["GET", key])).as_deref(),
        Some("v")
    );
    // A primary refuses to fail over.
    let err = cluster.failover(replica).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn a_killed_primary_is_replaced_by_its_replica() {
    let mut cluster = RedisCluster::start().unwrap();
    let key = "survivor";
    let owner = cluster.node_for_key(key).unwrap();
    let replies = cluster
        .commands(owner, &[&["SET", key, "v"], &["WAIT", "1", "5000"]])
        .unwrap();
    assert_eq!(replies[1].int(), Some(1));
    let replica = *cluster
        .replicas()
        .unwrap()
        .iter()
        .find(|&&r| cluster.primary_of(r).unwrap() == Some(owner))
        .unwrap();

    let killed = Instant::now();
    cluster.kill(owner).unwrap();
    cluster.wait_until_ok(Duration::from_secs(30)).unwrap();
    eprintln!(
        "redis-cluster: the killed primary's replica serves its slots {:?} later (node timeout \
         {:?})",
        killed.elapsed(),
        cluster.node_timeout()
    );
    assert_eq!(cluster.node_for_key(key).unwrap(), replica);
    assert_eq!(
        text(cluster.command(replica, &["GET", key])).as_deref(),
        Some("v")
    );

    // Back, it is the new primary's replica.
    let restarted = Instant::now();
    cluster.restart(owner).unwrap();
    cluster.wait_until_ok(Duration::from_secs(30)).unwrap();
    eprintln!(
        "redis-cluster: the old primary rejoined as a replica in {:?}",
        restarted.elapsed()
    );
    assert_eq!(cluster.primary_of(owner).unwrap(), Some(replica));
    assert_eq!(cluster.role(owner).as_deref(), Some("slave"));
    // A replica sends clients to its primary.
    let moved = cluster.command(owner, &["GET", key]).unwrap_err();
    let expected = format!(
        "MOVED {} {}",
        cluster.slot(key).unwrap(),
        cluster.addr(replica)
    );
    assert_eq!(moved.to_string(), expected);
    // Unless the connection asked to read from replicas: it came back empty and resynced.
    let replies = cluster
        .commands(owner, &[&["READONLY"], &["GET", key]])
        .unwrap();
    assert_eq!(replies[1].text().as_deref(), Some("v"));
}

#[test]
fn dropping_the_cluster_kills_every_node_and_removes_its_files() {
    let cluster = RedisCluster::start().unwrap();
    let pids: Vec<u32> = (0..cluster.len())
        .map(|i| cluster.pid(i).unwrap())
        .collect();
    let log = cluster.log_path(0).to_path_buf();
    assert!(log.exists());
    cluster.pause(2).unwrap();
    drop(cluster);
    assert!(pids.iter().all(|&pid| !process_alive(pid)));
    assert!(!log.exists());
}

/// `TIME` of a node, in seconds since the epoch.
fn server_time(reply: RedisReply) -> i64 {
    reply.array().unwrap()[0].text().unwrap().parse().unwrap()
}

fn now_secs() -> i64 {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
    i64::try_from(now.unwrap().as_secs()).unwrap()
}

#[test]
fn smaller_setups_run_on_a_server_clock() {
    let clock = ServerClock::new().unwrap();
    let sentinel = RedisSentinel::builder()
        .replicas(1)
        .sentinels(1)
        .clock(&clock)
        .start()
        .unwrap();
    assert_eq!(sentinel.len(), 2);
    assert_eq!(sentinel.sentinel_addrs().len(), 1);
    let cluster = RedisCluster::builder()
        .replicas(0)
        .clock(&clock)
        .start()
        .unwrap();
    assert_eq!(cluster.len(), 3);
    assert_eq!(cluster.primaries().unwrap(), vec![0, 1, 2]);

    clock.step_forward(Duration::from_secs(3600));
    for i in 0..2 {
        let ahead = server_time(sentinel.command(i, &["TIME"]).unwrap()) - now_secs();
        assert!((3590..3610).contains(&ahead), "{ahead}");
    }
    for i in 0..3 {
        let ahead = server_time(cluster.command(i, &["TIME"]).unwrap()) - now_secs();
        assert!((3590..3610).contains(&ahead), "{ahead}");
    }
}

#[test]
fn the_kit_types_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<RedisSentinel>();
    send_sync::<RedisCluster>();
}
