//! The adversary made systematic on Redis under Sentinel: the same protocols as on one Redis
//! server — mutex acquire and release, the FIFO hand-over to a waiter of another process, read
//! and write locks, a semaphore lease, a job's claim with its `at_least` window, a leader's
//! election, and the mutex and the hand-over of a victim without fencing tokens — run once per
//! request boundary k, cut there, and judged by the history checker, with a victim that
//! connects with `redis+sentinel://<sentinels>/<master>`.
//!
//! A Sentinel client goes where the Sentinels say: it asks them for the primary for every new
//! connection (then `ROLE` on it), and listens to every Sentinel for `+switch-master`. So the
//! victim is routed through the test kit's relays by the Sentinels themselves: a relay in front
//! of the primary, and the Sentinels monitor the primary through it (`SENTINEL REMOVE`, then
//! `SENTINEL MONITOR` with the relay's address, once per sweep), so that they name the relay;
//! and a relay in front of each Sentinel, the victim's URL naming those. All the relays are
//! started beside each other (one count of the victim's requests, Sentinel queries and
//! subscriptions included, one cut, one partition: see
//! [`Relay::start_beside`](zklock_testkit::Relay::start_beside)). The Sentinels' own
//! connections through the primary's relay (each begins with `CLIENT SETNAME sentinel-…`) are
//! not counted ([`Relay::uncounted_when_first_request_has`](zklock_testkit::Relay::uncounted_when_first_request_has)),
//! and the Sentinels hold the primary down only after a minute of silence: a partition of the
//! victim never makes them fail over (failovers are `faults/fault_redis_sentinel/`'s).
//!
//! The other process connects to the primary directly (`redis://`: the same keys and scripts
//! as the primary of a Sentinel URL), and the checker reads it directly. Each run is judged as
//! on one server (see `cut_every_request_redis.rs`: `Reset`, `Cancel`, `Kill`; no two believed
//! holders, tokens increasing; nothing stuck, nothing left; a job's window never shrinks). The
//! relays last the sweep; after a victim cut off for good, the next run resets and heals them
//! (what the dead victim left unsent never reaches the server).
//!
//! k runs over every request the protocol sends (counted on an uncut run). In CI each k gets
//! one kind of cut, rotating, and the last k also `Kill`;
//! `ZKLOCK_CUTS=all cargo test --test cuts -- cut_every_request_redis_sentinel::` runs every
//! kind at every k.

use crate::cuts;

use std::sync::Arc;
use std::time::{Duration, Instant};

use cuts::{sweep_through_relay, LeaseServer, Protocol};
use zklock::LockManager;
use zklock_testkit::{After, RedisReply, RedisSentinel, Relay};

/// How long the Sentinels may take to monitor the primary through its relay.
const MONITORED_WITHIN: Duration = Duration::from_secs(10);
/// The Sentinels' `down-after-milliseconds`: longer than any partition of a run.
const DOWN_AFTER_MS: u32 = 60_000;

/// Runs blocking test-kit calls without stalling the runtime.
fn blocking<T>(f: impl FnOnce() -> T) -> T {
    tokio::task::block_in_place(f)
}

/// The lock path of `key` in `protocol` (where its holder keys live).
fn lock_path(m: &LockManager, protocol: Protocol, key: &str) -> String {
    match protocol {
        Protocol::Read | Protocol::Write => m.rwlock(key).unwrap().path().to_string(),
        Protocol::Semaphore => format!("{}/%SEM/{key}", m.namespace()),
        Protocol::Leader => m.leader_latch(key, "look").unwrap().path().to_string(),
        _ => m.path_of(key).unwrap(),
    }
}

/// The test kit's primary with Sentinels, and the victim's relays (the primary's first, then
/// each Sentinel's), kept for the whole sweep.
struct Sentinel {
    redis: RedisSentinel,
    primary: usize,
    relays: Arc<Vec<Relay>>,
}

impl Sentinel {
    /// Starts a primary (no replica: nothing to fail over to) with 3 Sentinels, and makes the
    /// Sentinels monitor it through a relay.
    fn start() -> Sentinel {
        let redis = blocking(|| {
            RedisSentinel::builder()
                .replicas(0)
                .down_after(DOWN_AFTER_MS)
                .start()
        })
        .expect("start Redis with Sentinels (test kit)");
        let primary = blocking(|| redis.primary()).expect("the primary");
        let first = Relay::start(&redis.node_addr(primary)).expect("start a relay");
        first.uncounted_when_first_request_has(b"sentinel-");
        let mut relays = vec![first];
        for addr in redis.sentinel_addrs() {
            let relay = relays[0].start_beside(&addr).expect("start a relay");
            relays.push(relay);
        }
        let sentinel = Sentinel {
            redis,
            primary,
            relays: Arc::new(relays),
        };
        sentinel.monitor_through_relay();
        sentinel
    }

    /// Every Sentinel forgets the primary and monitors it again at its relay's address, and
    /// says so before this returns.
    fn monitor_through_relay(&self) {
        let name = self.redis.master_name().to_string();
        let port = self.relays[0].port().to_string();
        let quorum = (self.sentinels() / 2 + 1).to_string();
        let down = DOWN_AFTER_MS.to_string();
        blocking(|| {
            let sentinel = |j: usize, args: &[&str]| {
                self.redis
                    .sentinel_command(j, args)
                    .unwrap_or_else(|e| panic!("{args:?} on Sentinel {j}: {e}"))
            };
            // All forget it first: none tells the others (its hello messages) of the old
            // address while they monitor the new one.
            for j in 0..self.sentinels() {
                sentinel(j, &["SENTINEL", "REMOVE", &name]);
            }
            for j in 0..self.sentinels() {
                sentinel(
                    j,
                    &["SENTINEL", "MONITOR", &name, "127.0.0.1", &port, &quorum],
                );
                sentinel(
                    j,
                    &[
                        "SENTINEL",
                        "SET",
                        &name,
                        "down-after-milliseconds",
                        &down,
                        "failover-timeout",
                        "180000",
                    ],
                );
            }
            let since = Instant::now();
            loop {
                let named: Vec<Option<String>> = (0..self.sentinels())
                    .map(|j| {
                        let reply = self
                            .redis
                            .sentinel_command(j, &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", &name])
                            .ok()?;
                        let port = reply.array()?.get(1)?.text()?;
                        // And it is connected: a master, not held down.
                        let master = self
                            .redis
                            .sentinel_command(j, &["SENTINEL", "MASTER", &name])
                            .ok()?;
                        let flags = flags_of(&master)?;
                        Some(format!("{port} {flags}"))
                    })
                    .collect();
                let want = format!("{port} master");
                if named.iter().all(|n| n.as_deref() == Some(want.as_str())) {
                    return;
                }
                assert!(
                    since.elapsed() < MONITORED_WITHIN,
                    "the Sentinels do not all monitor the primary at its relay's port {port} \
                     within {MONITORED_WITHIN:?}: {named:?}"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        });
    }

    /// The number of Sentinels.
    fn sentinels(&self) -> usize {
        self.redis.sentinel_addrs().len()
    }

    /// A command to the primary, directly.
    fn command(&self, args: &[&str]) -> RedisReply {
        blocking(|| self.redis.command(self.primary, args))
            .unwrap_or_else(|e| panic!("{args:?} on the primary: {e}"))
    }
}

/// The `flags` of a `SENTINEL MASTER` reply (`[name, value, ...]`).
fn flags_of(reply: &RedisReply) -> Option<String> {
    let items = reply.array()?;
    items
        .chunks(2)
        .find(|kv| kv[0].text().as_deref() == Some("flags"))?
        .get(1)?
        .text()
}

impl LeaseServer for Sentinel {
    const LEASE: Duration = Duration::from_secs(2);

    /// The primary, directly: the other process connects with it.
    fn url(&self) -> String {
        format!("redis://{}/", self.redis.node_addr(self.primary))
    }

    fn addr(&self) -> String {
        self.redis.node_addr(self.primary)
    }

    fn lock_path(&self, m: &LockManager, protocol: Protocol, key: &str) -> String {
        lock_path(m, protocol, key)
    }

    /// The mutex's queue of waiting processes is not empty.
    async fn waiting(&self, path: &str) -> bool {
        let queued = self.command(&["ZCARD", &format!("zklock:queue:{path}")]);
        queued.int().unwrap() > 0
    }

    async fn window(&self, path: &str) -> Option<i64> {
        self.command(&["GET", &format!("zklock:run:{path}")])
            .text()
            .map(|ms| ms.parse().expect("a job's window end, in ms"))
    }

    /// The holder keys (exclusive, shared, a writer's intent) of the lock at `path` that exist.
    async fn left(&self, path: &str) -> Vec<String> {
        ["lock", "shared", "intent"]
            .iter()
            .map(|kind| format!("zklock:{kind}:{path}"))
            .filter(|name| self.command(&["EXISTS", name]).int() == Some(1))
            .collect()
    }

    /// Redis keeps no session of a client that went silent: its lease is what ends.
    async fn sessions_left(&self, _: &str) -> Vec<String> {
        vec![]
    }

    /// The sweep's relays, reset and healed first when the last run's victim was cut off for
    /// good; the victim's URL names the Sentinels' relays.
    async fn victim_route(&self) -> (Arc<Vec<Relay>>, String) {
        // A cut the last run armed and its victim never reached (it sent fewer requests that
        // time) is replaced by one that never comes.
        self.relays[0].cut_after_nth_request(u64::MAX, After::Reset);
        if self.relays.iter().any(Relay::is_blackholed) {
            // The Sentinels' connections through the primary's relay are reset too: they
            // reconnect, uncounted, within a second.
            for relay in self.relays.iter() {
                relay.reset();
                relay.heal();
            }
        }
        let sentinels: Vec<String> = self.relays[1..]
            .iter()
            .map(|r| r.addr().to_string())
            .collect();
        let url = format!(
            "redis+sentinel://{}/{}",
            sentinels.join(","),
            self.redis.master_name()
        );
        (self.relays.clone(), url)
    }
}

/// Sweeps `protocol` on a setup of its own.
async fn sweep_sentinel(protocol: Protocol, offset: usize) {
    let sentinel = Sentinel::start();
    sweep_through_relay(&sentinel, protocol, offset).await;
}

cuts::sweep_tests!(sweep_sentinel {
    mutex_cut_at_every_request: Mutex, 0;
    handover_cut_at_every_request: Handover, 1;
    read_lock_cut_at_every_request: Read, 2;
    write_lock_cut_at_every_request: Write, 0;
    semaphore_cut_at_every_request: Semaphore, 1;
    job_cut_at_every_request: Job, 2;
    leader_cut_at_every_request: Leader, 0;
    untokened_mutex_cut_at_every_request: Untokened, 1;
    untokened_handover_cut_at_every_request: UntokenedHandover, 2;
});
