//! What the fence tests of every store share: the scenarios, run against a [`Subject`] (one
//! store's fenced write of a value that also appends it to a log, both in the same fenced
//! step), and how to find tokens that local handoffs made.
#![allow(dead_code)]

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use zklock::fence::Outcome;
use zklock::{FencingToken, LockManager};

/// One store seen through its fence, on one connection.
pub trait Subject: Send + Sync + Sized + 'static {
    /// Another connection to the same store (for concurrent writers).
    fn another(&self) -> impl Future<Output = Self> + Send;
    /// The fenced write: set `resource`'s value to `value` and append `value` to its log, if
    /// `token` is not older than the last accepted one.
    fn write(
        &self,
        resource: &str,
        token: FencingToken,
        value: &str,
    ) -> impl Future<Output = Outcome> + Send;
    /// The value of `resource`, as written by the last accepted write.
    fn value(&self, resource: &str) -> impl Future<Output = Option<String>> + Send;
    /// Every value written to `resource`, in the order the store applied them.
    fn log(&self, resource: &str) -> impl Future<Output = Vec<String>> + Send;
    /// The fence's last accepted token of `resource`.
    fn last(&self, resource: &str) -> impl Future<Output = Option<FencingToken>> + Send;
}

fn t(zxid: i64, local: u32) -> FencingToken {
    FencingToken::new(zxid, local)
}

/// Older tokens are refused, equal and newer ones accepted, also where a double could not
/// tell two zxids apart (2^53 and 2^53 + 1), and across the sign of the zxid.
pub async fn older_refused_newer_accepted<S: Subject>(s: &S, resource: &str) {
    let big = 1i64 << 53;
    let steps: &[(FencingToken, bool)] = &[
        (t(-7, 0), true),
        (t(5, 0), true),
        (t(5, 0), true), // the same hold writing again
        (t(5, 1), true), // a local handoff
        (t(4, 9), false),
        (t(-7, 0), false),
        (t(0xffff_ffff, 0), true),
        (t(0x1_0000_0000, 0), true), // the next epoch
        (t(0xffff_ffff, u32::MAX), false),
        (t(big, 0), true),
        (t(big + 1, 0), true),
        (t(big, 7), false), // the same double as big + 1
        (t(big + 1, 2), true),
        (t(big + 1, 1), false),
    ];
    let mut last = None;
    let mut written = Vec::new();
    for (i, &(token, accept)) in steps.iter().enumerate() {
        let value = format!("v{i}");
        let outcome = s.write(resource, token, &value).await;
        if accept {
            assert_eq!(
                outcome,
                Outcome::Accepted(()),
                "step {i}: {token} must pass"
            );
            last = Some(token);
            written.push(value);
        } else {
            assert_eq!(
                outcome,
                Outcome::Stale {
                    last: last.unwrap()
                },
                "step {i}: {token} is older than {}",
                last.unwrap()
            );
        }
        assert_eq!(s.last(resource).await, last, "step {i}");
    }
    assert_eq!(
        s.value(resource).await.as_deref(),
        written.last().map(|v| &**v)
    );
    assert_eq!(s.log(resource).await, written);
}

/// `writers` concurrent writers with distinct tokens in shuffled order, spread over `conns`
/// connections: each gets one outcome; the store applied exactly the accepted ones, in
/// increasing token order; every refusal names a newer token; the newest token's write is
/// accepted and is the final value.
pub async fn concurrent_writers<S: Subject>(
    s: &S,
    resource: &str,
    writers: usize,
    conns: usize,
    seed: u64,
) {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut tokens = BTreeSet::new();
    while tokens.len() < writers {
        // Few zxids, so that many tokens differ only in their local count.
        tokens.insert(t(1_000 + rng.gen_range(0..6), rng.gen_range(0..4)));
    }
    let mut order: Vec<FencingToken> = tokens.iter().copied().collect();
    order.shuffle(&mut rng);
    let newest = *tokens.last().unwrap();

    let mut connections = Vec::new();
    for _ in 0..conns {
        connections.push(Arc::new(s.another().await));
    }
    let start = Arc::new(tokio::sync::Barrier::new(writers));
    let mut tasks = Vec::new();
    for (i, token) in order.iter().copied().enumerate() {
        let conn = connections[i % conns].clone();
        let start = start.clone();
        let resource = resource.to_string();
        tasks.push(tokio::spawn(async move {
            start.wait().await;
            let outcome = conn.write(&resource, token, &token.to_string()).await;
            (token, outcome)
        }));
    }
    let mut accepted = BTreeSet::new();
    let mut refused = 0;
    for task in tasks {
        let (token, outcome) = task.await.unwrap();
        match outcome {
            Outcome::Accepted(()) => {
                accepted.insert(token);
            }
            Outcome::Stale { last } => {
                assert!(
                    last > token,
                    "{token} refused for {last}, which is not newer"
                );
                assert!(tokens.contains(&last), "{last} was never written");
                refused += 1;
            }
        }
    }
    assert_eq!(accepted.len() + refused, writers);
    assert!(
        accepted.contains(&newest),
        "the newest token {newest} was refused"
    );
    assert!(
        refused > 0,
        "no writer came after a newer one: the test raced nothing"
    );
    let log: Vec<FencingToken> = s
        .log(resource)
        .await
        .iter()
        .map(|v| parse_display(v))
        .collect();
    assert!(
        log.windows(2).all(|w| w[0] < w[1]),
        "the store applied writes out of token order: {log:?}"
    );
    assert_eq!(
        log.iter().copied().collect::<BTreeSet<_>>(),
        accepted,
        "the store applied exactly the accepted writes"
    );
    assert_eq!(s.value(resource).await, Some(newest.to_string()));
    assert_eq!(s.last(resource).await, Some(newest));
    // And afterwards, the oldest of them is refused for the newest.
    let oldest = *tokens.first().unwrap();
    assert_eq!(
        s.write(resource, oldest, "late").await,
        Outcome::Stale { last: newest }
    );
}

/// Reads back `FencingToken`'s display form (`zxid` or `zxid.local`).
pub fn parse_display(s: &str) -> FencingToken {
    let (zxid, local) = s.split_once('.').unwrap_or((s, "0"));
    FencingToken::new(zxid.parse().unwrap(), local.parse().unwrap())
}

/// Three tasks of one process take `key` on `manager` in turn, the later ones handed the lock
/// locally by the one before (so with `local > 0`), each writing through `write` while it
/// holds; returns their tokens in grant order. `write` gets the guard.
pub async fn local_handoffs<W, Fut>(manager: &LockManager, key: &str, write: W) -> Vec<FencingToken>
where
    W: Fn(zklock::LockGuard) -> Fut,
    Fut: Future<Output = (FencingToken, zklock::LockGuard)>,
{
    let first = manager.lock(key).await.unwrap();
    let granted = tokio::sync::Mutex::new(Vec::new());
    let waiter = |n: usize| {
        let granted = &granted;
        let write = &write;
        async move {
            let guard = manager.lock(key).await.unwrap();
            let (token, guard) = write(guard).await;
            granted.lock().await.push((n, token));
            guard.release().await.unwrap();
        }
    };
    let (token0, first) = write(first).await;
    let releaser = async move {
        // Let both waiters queue behind the first holder in this process.
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        first.release().await.unwrap();
    };
    futures::join!(waiter(1), waiter(2), releaser);
    let mut tokens = vec![token0];
    tokens.extend(granted.into_inner().into_iter().map(|(_, t)| t));
    assert!(
        tokens.windows(2).all(|w| w[0] < w[1]),
        "grant order is token order: {tokens:?}"
    );
    assert!(
        tokens[1..].iter().any(|t| t.local() > 0),
        "no grant was a local handoff: {tokens:?}"
    );
    tokens
}
