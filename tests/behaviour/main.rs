//! One behaviour suite, run against every backend.
//!
//! Each behaviour is written once, as an async fn of the backend it runs on, against managers
//! made by an [`Env`]; the `every_backend!` macro instantiates it for ZooKeeper (a real server
//! from the test kit, one session per "process"), for Redis (a real `redis-server` from the
//! test kit, one manager with its own connections per "process"), for Redis under Sentinel (the
//! test kit's primary with 2 replicas and 3 Sentinels, one setup that every behaviour of the
//! binary shares, each in a namespace of its own; managers connect with `redis+sentinel://`),
//! for Redis Cluster (the test kit's Cluster of 3 primaries, likewise shared, each behaviour in
//! a namespace of its own; managers connect with `redis+cluster://<every node>`, and what a
//! behaviour looks at is read from the primary that serves the key's slot), for PostgreSQL (a real PostgreSQL from the test kit, one manager with its own connections per
//! "process"), for etcd (a real etcd from the test kit, one manager with its own lease per
//! "process") and for the in-memory backend (clones of one in-memory manager, which share its
//! lock table), so the tests read `mutex_excludes::zookeeper`, `mutex_excludes::redis`,
//! `mutex_excludes::redis_sentinel`, `mutex_excludes::redis_cluster`, `mutex_excludes::postgres`,
//! `mutex_excludes::etcd` and `mutex_excludes::memory`.
//! Behaviours that need distinct contenders at the backend run their scenario twice: with the
//! local queue (tasks of a process queue behind one hold) and without it
//! (`local_queue(false)`: every acquire is a contender of its own).
//!
//! What a backend leaves out on purpose (inspection and revocation off ZooKeeper, the
//! ZooKeeper client, `lose` off memory, semaphores on PostgreSQL) is checked to fail with
//! `Error::Unsupported` naming the backend. Where "a hold is lost" comes from differs: the
//! session expired on ZooKeeper, the lock's key deleted behind the holder's back on Redis (as a
//! failover to a replica that never got it would; under Sentinel, on the primary; on the Cluster,
//! on the primary of the lock's slot), the holding
//! session ended by the server on PostgreSQL (`pg_terminate_backend`), the holder's key deleted
//! from outside on etcd, `lose` in memory.

mod attribute;
#[path = "../common/cluster.rs"]
mod cluster;
#[path = "../common/mod.rs"]
mod common;
mod env;
mod mutex;
mod operators;
mod reentry;
mod rwlock;
mod semaphore;
mod tokens;

use std::future::Future;
use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use tokio::sync::{oneshot, Barrier};
use tokio::task::JoinHandle;
use zklock::{
    current_fencing_token, distributed_lock, Deadlock, Error, FencingToken, LockManager, LossReason,
};
use zklock_testkit::{
    EtcdServer, MariaDbServer, PostgresServer, RedisCluster, RedisSentinel, RedisServer,
};

use attribute::*;
use env::*;
use mutex::*;
use operators::*;
use reentry::*;
use rwlock::*;
use semaphore::*;
use tokens::*;

/// How long one behaviour may take on any backend before it counts as a hang.
const BOUND: Duration = Duration::from_secs(120);

/// Instantiates each behaviour for every backend: `name::zookeeper`, `name::redis`,
/// `name::redis_sentinel`, `name::redis_cluster`, `name::postgres`, `name::etcd` and
/// `name::memory`.
macro_rules! every_backend {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn zookeeper() {
                tokio::time::timeout(BOUND, super::$name(Backend::Zookeeper))
                    .await
                    .expect(concat!(stringify!($name), " hung on ZooKeeper"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis() {
                tokio::time::timeout(BOUND, super::$name(Backend::Redis))
                    .await
                    .expect(concat!(stringify!($name), " hung on Redis"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_sentinel() {
                tokio::time::timeout(BOUND, super::$name(Backend::RedisSentinel))
                    .await
                    .expect(concat!(stringify!($name), " hung on Redis under Sentinel"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn redis_cluster() {
                tokio::time::timeout(BOUND, super::$name(Backend::RedisCluster))
                    .await
                    .expect(concat!(stringify!($name), " hung on Redis Cluster"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn postgres() {
                tokio::time::timeout(BOUND, super::$name(Backend::Postgres))
                    .await
                    .expect(concat!(stringify!($name), " hung on PostgreSQL"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn etcd() {
                tokio::time::timeout(BOUND, super::$name(Backend::Etcd))
                    .await
                    .expect(concat!(stringify!($name), " hung on etcd"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn mysql() {
                tokio::time::timeout(BOUND, super::$name(Backend::MySql))
                    .await
                    .expect(concat!(stringify!($name), " hung on MySQL"));
            }

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn memory() {
                tokio::time::timeout(BOUND, super::$name(Backend::Memory))
                    .await
                    .expect(concat!(stringify!($name), " hung in memory"));
            }
        }
    )*};
}

every_backend!(
    mutex_excludes,
    fencing_tokens_increase,
    fencing_tokens_can_be_off,
    lock_timeout_leaves_nothing,
    try_lock_is_none_while_held,
    a_dropped_guard_frees_the_key_for_its_process,
    a_loop_of_tries_gives_the_thread_back,
    cancelled_acquires_leave_nothing,
    with_lock_frames_reenter,
    readers_share_writers_exclude,
    write_inside_read_would_deadlock,
    downgrade_keeps_queued_writer_out,
    semaphore_admits_at_most_n,
    acquire_many_is_all_or_none,
    loss_is_reported,
    attribute_locks_on_either_manager,
    one_name_is_one_lock,
    reentry_keeps_its_deadline,
    mixed_settings_keep_every_promise,
    operators_see_holders_and_waiters,
    backend_specific_features,
);
