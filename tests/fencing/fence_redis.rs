//! The Redis fence (`RedisFence`) against a real `redis-server` (the test kit's): fenced `SET`,
//! `HSET` and scripts refuse older tokens and accept equal and newer ones; concurrent writers
//! end with the newest token's write; tokens of local handoffs of real Redis locks pass; and
//! the last token survives a restart of a durable server.

use crate::fence;

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::AsyncCommands;
use zklock::fence::{Fence, FenceError, Fenced, FencedScript, Outcome, RedisFence, RedisWrite};
use zklock::{FencingToken, LockManager};
use zklock_testkit::RedisServer;

use fence::Subject;

/// The fenced write of the scenarios: the value and the log in one script.
const SET_AND_LOG: &str = r#"
redis.call('SET', KEYS[1], ARGV[1])
redis.call('RPUSH', KEYS[2], ARGV[1])
return redis.call('LLEN', KEYS[2])
"#;

struct RedisSubject {
    url: String,
    conn: MultiplexedConnection,
    fence: RedisFence,
    script: FencedScript,
}

async fn connect(url: &str) -> MultiplexedConnection {
    redis::Client::open(url)
        .unwrap()
        .get_multiplexed_async_connection_with_config(&crate::common::unhurried())
        .await
        .expect("connect to the test redis-server")
}

impl RedisSubject {
    async fn new(url: &str) -> RedisSubject {
        let conn = connect(url).await;
        RedisSubject {
            url: url.to_string(),
            fence: RedisFence::new(conn.clone()),
            conn,
            script: FencedScript::new(SET_AND_LOG),
        }
    }
}

impl Subject for RedisSubject {
    async fn another(&self) -> Self {
        RedisSubject::new(&self.url).await
    }

    async fn write(&self, resource: &str, token: FencingToken, value: &str) -> Outcome {
        let keys = [format!("value:{resource}"), format!("log:{resource}")];
        self.fence
            .fenced_write(
                resource,
                token,
                RedisWrite::script(&self.script, &keys, &[value]),
            )
            .await
            .unwrap()
            .map(|_| ())
    }

    async fn value(&self, resource: &str) -> Option<String> {
        self.conn
            .clone()
            .get(format!("value:{resource}"))
            .await
            .unwrap()
    }

    async fn log(&self, resource: &str) -> Vec<String> {
        self.conn
            .clone()
            .lrange(format!("log:{resource}"), 0, -1)
            .await
            .unwrap()
    }

    async fn last(&self, resource: &str) -> Option<FencingToken> {
        self.fence.last_token(resource).await.unwrap()
    }
}

fn server() -> RedisServer {
    RedisServer::start().expect("start redis-server (see the test kit's error)")
}

#[tokio::test]
async fn a_fenced_script_refuses_older_tokens_and_accepts_newer_and_equal() {
    let redis = server();
    let s = RedisSubject::new(&redis.url()).await;
    fence::older_refused_newer_accepted(&s, "sku_1").await;
    // The token is kept as a 30-digit string, not as a number Lua would round.
    let raw: String = s.conn.clone().get("zklock:accepted:sku_1").await.unwrap();
    assert_eq!(
        raw,
        FencingToken::new((1 << 53) + 1, 2).to_sortable_string()
    );
}

#[tokio::test]
async fn fenced_set_and_hset_refuse_older_tokens() {
    let redis = server();
    let s = RedisSubject::new(&redis.url()).await;
    let (old, new) = (FencingToken::new(10, 3), FencingToken::new(11, 0));
    let set = |token, v: i64| {
        s.fence
            .fenced_write("stock_7", token, RedisWrite::set("stock:7", v))
    };
    assert_eq!(
        set(old, 5).await.unwrap(),
        Outcome::Accepted(redis::Value::Okay)
    );
    assert_eq!(
        set(new, 4).await.unwrap(),
        Outcome::Accepted(redis::Value::Okay)
    );
    assert_eq!(
        set(new, 3).await.unwrap(),
        Outcome::Accepted(redis::Value::Okay)
    );
    assert_eq!(set(old, 9).await.unwrap(), Outcome::Stale { last: new });
    let stock: i64 = s.conn.clone().get("stock:7").await.unwrap();
    assert_eq!(stock, 3);

    let hset = |token, v: &'static str| {
        s.fence
            .fenced_write("user_9", token, RedisWrite::hset("user:9", "email", v))
    };
    assert_eq!(
        hset(new, "a@x").await.unwrap(),
        Outcome::Accepted(redis::Value::Int(1))
    );
    assert_eq!(
        hset(old, "stale@x").await.unwrap(),
        Outcome::Stale { last: new }
    );
    let email: String = s.conn.clone().hget("user:9", "email").await.unwrap();
    assert_eq!(email, "a@x");

    // A value that is several Redis arguments is refused before reaching the server.
    let err = s
        .fence
        .fenced_write("stock_7", new, RedisWrite::set("stock:7", vec!["a", "b"]))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("2 arguments"), "{err}");
    // A fence key that holds something else is reported, not compared.
    let _: () = s
        .conn
        .clone()
        .set("zklock:accepted:junk", "12")
        .await
        .unwrap();
    let err = set_junk(&s, new).await;
    assert!(err.contains("holds no fencing token"), "{err}");
}

async fn set_junk(s: &RedisSubject, token: FencingToken) -> String {
    s.fence
        .fenced_write("junk", token, RedisWrite::set("x", 1))
        .await
        .unwrap_err()
        .to_string()
}

#[tokio::test]
async fn a_script_sees_only_its_own_keys_and_args_and_runs_only_when_accepted() {
    let redis = server();
    let s = RedisSubject::new(&redis.url()).await;
    let echo = FencedScript::new("return {KEYS[1], ARGV[1], #KEYS, #ARGV}");
    let token = FencingToken::new(3, 0);
    let reply = s
        .fence
        .fenced_write(
            "r",
            token,
            RedisWrite::script(&echo, &["k1", "k2"], &["a1"]),
        )
        .await
        .unwrap();
    assert_eq!(
        reply,
        Outcome::Accepted(redis::Value::Array(vec![
            redis::Value::BulkString(b"k1".to_vec()),
            redis::Value::BulkString(b"a1".to_vec()),
            redis::Value::Int(2),
            redis::Value::Int(1),
        ]))
    );
    // Refused: the script body does not run (its INCR would show).
    let incr = FencedScript::new("return redis.call('INCR', KEYS[1])");
    let refused = s
        .fence
        .fenced_write(
            "r",
            FencingToken::new(2, 0),
            RedisWrite::script(&incr, &["n"], &[] as &[&str]),
        )
        .await
        .unwrap();
    assert_eq!(refused, Outcome::Stale { last: token });
    let n: Option<i64> = s.conn.clone().get("n").await.unwrap();
    assert_eq!(n, None);
    // A script error leaves the token where it was.
    let boom = FencedScript::new("return redis.error_reply('boom')");
    let newer = FencingToken::new(4, 0);
    assert!(s
        .fence
        .fenced_write(
            "r",
            newer,
            RedisWrite::script(&boom, &[] as &[&str], &[] as &[&str])
        )
        .await
        .is_err());
    assert_eq!(s.last("r").await, Some(token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_end_with_the_newest_tokens_write() {
    let redis = server();
    let s = RedisSubject::new(&redis.url()).await;
    for seed in 0..3 {
        fence::concurrent_writers(&s, &format!("hot_{seed}"), 20, 4, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_local_handoffs_of_redis_locks_are_fenced_in_grant_order() {
    let redis = server();
    let s = RedisSubject::new(&redis.url()).await;
    let manager = LockManager::connect(&redis.url()).await.unwrap();
    let resource = manager.path_of("sku_5").unwrap();
    let tokens = fence::local_handoffs(&manager, "sku_5", |guard| {
        let s = &s;
        let resource = resource.clone();
        async move {
            let writer = guard.fenced(&s.fence);
            assert_eq!(writer.resource(), resource);
            assert_eq!(writer.token(), guard.fencing_token());
            let keys = ["value:sku_5", "log:sku_5"];
            let value = writer.token().to_string();
            let outcome = writer
                .write(RedisWrite::script(&s.script, &keys, &[&value]))
                .await
                .unwrap();
            assert!(outcome.is_accepted(), "{outcome:?}");
            (guard.fencing_token(), guard)
        }
    })
    .await;
    let logged: Vec<String> = s.conn.clone().lrange("log:sku_5", 0, -1).await.unwrap();
    assert_eq!(
        logged,
        tokens.iter().map(|t| t.to_string()).collect::<Vec<_>>()
    );
    // The first holder, had it been paused and written late, is refused.
    let late = Fenced::new(&s.fence, resource, tokens[0]);
    assert_eq!(
        late.write(RedisWrite::set("value:sku_5", "late"))
            .await
            .unwrap(),
        Outcome::Stale { last: tokens[2] }
    );
}

#[tokio::test]
async fn the_last_token_survives_a_restart_of_a_durable_server() {
    let mut redis = RedisServer::start_durable().expect("start redis-server");
    let s = RedisSubject::new(&redis.url()).await;
    let (old, new) = (FencingToken::new(70, 0), FencingToken::new(70, 1));
    assert_eq!(s.write("doc", new, "after").await, Outcome::Accepted(()));
    redis.restart().expect("restart redis-server");
    let s = tokio::time::timeout(Duration::from_secs(20), RedisSubject::new(&redis.url()))
        .await
        .unwrap();
    assert_eq!(
        s.write("doc", old, "stale").await,
        Outcome::Stale { last: new }
    );
    assert_eq!(s.value("doc").await.as_deref(), Some("after"));
    assert_eq!(
        s.write("doc", FencingToken::new(71, 0), "next").await,
        Outcome::Accepted(())
    );
}

/// A hold without a token (its manager's `fencing_tokens(false)`) gives
/// `FencingToken::NONE`, below every token: a first write would take it. The fence refuses it
/// with `NoToken` before the server is asked, and nothing is written.
#[tokio::test]
async fn no_token_is_refused_before_the_store() {
    let redis = server();
    let s = RedisSubject::new(&redis.url()).await;
    let keys = ["value:doc".to_string(), "log:doc".to_string()];
    let err = s
        .fence
        .fenced_write(
            "doc",
            FencingToken::NONE,
            RedisWrite::script(&s.script, &keys, &["x"]),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::NoToken { .. }), "{err}");
    assert_eq!(s.last("doc").await, None);
    assert_eq!(s.value("doc").await, None);
}
