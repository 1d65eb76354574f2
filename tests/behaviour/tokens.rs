//! Fencing tokens turned off (`Builder::fencing_tokens(false)`): holds report none, fenced
//! writes refuse to go out without one, the backend does no token work, and processes with and
//! without tokens share a key.

use super::*;
use zklock::fence::{FenceError, MemoryFence};

/// The token state the backend keeps for the lock at `path`: the fence counter on Redis, the
/// key row's `fence` on PostgreSQL; `None` where tokens cost nothing to keep (ZooKeeper's
/// czxid, memory's counter).
async fn token_state(env: &Env, path: &str) -> Option<i64> {
    match env.backend {
        Backend::Redis | Backend::RedisSentinel | Backend::RedisCluster => {
            let name = env.redis_key("fence", path);
            let mut c = env.redis_conn(&name).await;
            let fence: Option<i64> = redis::cmd("GET")
                .arg(&name)
                .query_async(&mut c)
                .await
                .expect("GET the fence counter");
            Some(fence.unwrap_or(0))
        }
        Backend::Postgres => {
            let row = env
                .pg_client()
                .await
                .query_opt("SELECT fence FROM zklock_keys WHERE path = $1", &[&path])
                .await
                .expect("read the key row");
            Some(row.map_or(0, |r| r.get(0)))
        }
        Backend::MySql => {
            let name = zklock::mysql_lock_name(path);
            let fence = env.mysql_sql(&format!(
                "SELECT fence FROM zklock.zklock_locks WHERE name = '{name}'"
            ));
            Some(fence.parse().unwrap_or(0))
        }
        Backend::Zookeeper | Backend::Etcd | Backend::Memory => None,
    }
}

/// A manager without tokens: every hold, local handoffs, re-takes and leases included, has
/// [`FencingToken::NONE`]; a fenced write through it fails with `NoToken` and leaves the store
/// as it was; a grant does no token work on the server (Redis's fence counter and PostgreSQL's
/// key row stay as the last holder with tokens left them); and a manager with tokens on the
/// same key still gets a token above every earlier one.
pub(crate) async fn fencing_tokens_can_be_off(backend: Backend) {
    let env = Env::start(backend);
    let with = env.process(Queue::Local).await;
    let linger = Duration::from_millis(200);
    let without = env
        .process_with(Queue::Local, |b| b.fencing_tokens(false).linger(linger))
        .await;
    let key = "untokened";
    let path = with.path_of(key).unwrap();
    let store = MemoryFence::new();

    // A holder with tokens first, so that the backend has token state for the key.
    let first = with.lock(key).await.unwrap();
    let first_token = first.fencing_token();
    assert!(!first_token.is_none());
    assert!(first.fenced(&store).write(1).await.unwrap().is_accepted());
    first.release().await.unwrap();
    let state = token_state(&env, &path).await;
    assert!(
        !matches!(state, Some(s) if s <= 0),
        "no token state read for {path}: {state:?}"
    );

    // Without tokens: a fresh grant, a local handoff, and a re-take of the lingering hold
    // (which on Redis confirms a hold that has no token against the lock's fence).
    for round in 0..3 {
        let guard = without.lock(key).await.unwrap();
        assert_eq!(guard.fencing_token(), FencingToken::NONE, "round {round}");
        assert!(guard.is_held(), "round {round}");
        let refused = guard.fenced(&store).write(100 + round).await;
        assert!(
            matches!(&refused, Err(FenceError::NoToken { resource }) if *resource == path),
            "round {round}: {refused:?}"
        );
        assert!(refused
            .unwrap_err()
            .to_string()
            .contains("fencing_tokens(false)"));
        if round == 1 {
            // A task queued behind this hold gets it by a local handoff.
            let queued = {
                let without = without.clone();
                tokio::spawn(async move {
                    let g = without.lock(key).await.unwrap();
                    let t = g.fencing_token();
                    g.release().await.unwrap();
                    t
                })
            };
            tokio::time::sleep(Duration::from_millis(50)).await;
            guard.release().await.unwrap();
            assert_eq!(queued.await.unwrap(), FencingToken::NONE);
        } else {
            guard.release().await.unwrap();
        }
    }
    let inside = without
        .with_lock(key, async { current_fencing_token() })
        .await
        .unwrap();
    assert_eq!(inside, Some(FencingToken::NONE));
    assert_eq!(
        store.value(&path),
        Some(1),
        "a write without a token got through"
    );
    assert_eq!(
        token_state(&env, &path).await,
        state,
        "a grant without tokens did token work on the server"
    );
    without.flush().await;

    // With tokens again, after the holds without: above every earlier token.
    let next = with.lock(key).await.unwrap();
    assert!(next.fencing_token() > first_token);
    assert!(next.fenced(&store).write(2).await.unwrap().is_accepted());
    next.release().await.unwrap();

    // Semaphore leases too, where the backend has semaphores.
    if !matches!(backend, Backend::Postgres | Backend::MySql) {
        let lease = without
            .semaphore("untokened_sem", 2)
            .unwrap()
            .acquire()
            .await
            .unwrap();
        assert_eq!(lease.fencing_token(), FencingToken::NONE);
        lease.release().await.unwrap();
    }
    assert_eq!(
        env.left_behind(&[with, without], &path).await,
        Vec::<String>::new()
    );
}
