//! The ZooKeeper fence (`ZkFence`) against a real ZooKeeper (the test kit's): a fenced multi
//! refuses older tokens and accepts equal and newer ones; concurrent writers on their own
//! sessions (racing for the token node's version) end with the newest token's write; tokens of
//! local handoffs of real ZooKeeper locks pass; and the last token survives a restart.

use crate::fence;

use std::time::Duration;

use zklock::fence::{Fence, FenceError, Fenced, Outcome, ZkFence, ZkWrite};
use zklock::zookeeper_client::{self, Acls, Client, CreateMode};
use zklock::{FencingToken, LockManager};
use zklock_testkit::ZkServer;

use fence::Subject;

const ROOT: &str = "/app/fence";

struct ZkSubject {
    connect: String,
    client: Client,
    fence: ZkFence,
}

async fn connect(connect: &str) -> Client {
    Client::connector()
        .with_session_timeout(Duration::from_secs(10))
        .connect(connect)
        .await
        .expect("connect to the test ZooKeeper")
}

/// The test's own nodes of a resource (a lock path's slashes made `_`).
fn value_node(resource: &str) -> String {
    format!("/app/data/{}", resource.replace('/', "_"))
}

fn log_dir(resource: &str) -> String {
    format!("/app/log/{}", resource.replace('/', "_"))
}

/// The fenced multi of the scenarios: the value node set and a sequential log node made.
fn set_and_log(resource: &str, value: &str) -> ZkWrite {
    let (node, log, value) = (value_node(resource), log_dir(resource), value.to_string());
    ZkWrite::new(move |multi| {
        multi.add_set_data(&node, value.as_bytes(), None)?;
        multi.add_create(
            &format!("{log}/e-"),
            value.as_bytes(),
            &CreateMode::PersistentSequential.with_acls(Acls::anyone_all()),
        )
    })
}

async fn mkdir(client: &Client, path: &str) {
    match client
        .mkdir(path, &CreateMode::Persistent.with_acls(Acls::anyone_all()))
        .await
    {
        Ok(()) | Err(zookeeper_client::Error::NodeExists) => {}
        Err(e) => panic!("mkdir {path}: {e}"),
    }
}

impl ZkSubject {
    async fn new(connect_string: &str) -> ZkSubject {
        let client = connect(connect_string).await;
        ZkSubject {
            connect: connect_string.to_string(),
            fence: ZkFence::new(client.clone(), ROOT).unwrap(),
            client,
        }
    }

    async fn prepare(&self, resource: &str) {
        mkdir(&self.client, &value_node(resource)).await;
        mkdir(&self.client, &log_dir(resource)).await;
    }
}

impl Subject for ZkSubject {
    async fn another(&self) -> Self {
        ZkSubject::new(&self.connect).await
    }

    async fn write(&self, resource: &str, token: FencingToken, value: &str) -> Outcome {
        self.prepare(resource).await;
        self.fence
            .fenced_write(resource, token, set_and_log(resource, value))
            .await
            .unwrap()
            .map(|results| assert_eq!(results.len(), 2, "the results of the two operations"))
    }

    async fn value(&self, resource: &str) -> Option<String> {
        let (data, _) = self.client.get_data(&value_node(resource)).await.ok()?;
        (!data.is_empty()).then(|| String::from_utf8(data).unwrap())
    }

    async fn log(&self, resource: &str) -> Vec<String> {
        let mut names = self.client.list_children(&log_dir(resource)).await.unwrap();
        names.sort();
        let mut values = Vec::new();
        for name in names {
            let (data, _) = self
                .client
                .get_data(&format!("{}/{name}", log_dir(resource)))
                .await
                .unwrap();
            values.push(String::from_utf8(data).unwrap());
        }
        values
    }

    async fn last(&self, resource: &str) -> Option<FencingToken> {
        self.fence.last_token(resource).await.unwrap()
    }
}

fn server() -> ZkServer {
    ZkServer::start().expect("start ZooKeeper (see the test kit's error)")
}

#[tokio::test]
async fn a_fenced_multi_refuses_older_tokens_and_accepts_newer_and_equal() {
    let zk = server();
    let s = ZkSubject::new(&zk.connect_string()).await;
    fence::older_refused_newer_accepted(&s, "sku_1").await;
    // The token node holds the 30-digit form, readable with any ZooKeeper tool.
    let (data, _) = s.client.get_data(&s.fence.node_of("sku_1")).await.unwrap();
    assert_eq!(
        String::from_utf8(data).unwrap(),
        FencingToken::new((1 << 53) + 1, 2).to_sortable_string()
    );
}

#[tokio::test]
async fn a_failing_operation_of_yours_applies_nothing_and_keeps_the_token() {
    let zk = server();
    let s = ZkSubject::new(&zk.connect_string()).await;
    let first = FencingToken::new(5, 0);
    assert_eq!(s.write("doc", first, "one").await, Outcome::Accepted(()));
    // The second operation sets a node that does not exist: the multi fails as a whole.
    let broken = ZkWrite::new(|multi| {
        multi.add_set_data("/app/data/doc", b"two", None)?;
        multi.add_set_data("/app/nowhere", b"x", None)
    });
    let err = s
        .fence
        .fenced_write("doc", FencingToken::new(6, 0), broken)
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            FenceError::ZooKeeper {
                op: Some(1),
                source: zookeeper_client::Error::NoNode
            }
        ),
        "{err}"
    );
    assert_eq!(s.value("doc").await.as_deref(), Some("one"));
    assert_eq!(s.last("doc").await, Some(first));
    assert!(ZkFence::new(s.client.clone(), "relative").is_err());
    assert!(ZkFence::new(s.client.clone(), "/trailing/").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_end_with_the_newest_tokens_write() {
    let zk = server();
    let s = ZkSubject::new(&zk.connect_string()).await;
    for seed in 0..2 {
        let resource = format!("hot_{seed}");
        s.prepare(&resource).await;
        fence::concurrent_writers(&s, &resource, 16, 8, seed).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_local_handoffs_of_zookeeper_locks_are_fenced_in_grant_order() {
    let zk = server();
    let s = ZkSubject::new(&zk.connect_string()).await;
    let manager = LockManager::connect(&zk.connect_string()).await.unwrap();
    let resource = manager.path_of("sku_5").unwrap();
    s.prepare(&resource).await;
    let tokens = fence::local_handoffs(&manager, "sku_5", |guard| {
        let (s, resource) = (&s, resource.clone());
        async move {
            let writer = guard.fenced(&s.fence);
            assert_eq!(writer.resource(), resource);
            assert_eq!(writer.token(), guard.fencing_token());
            let value = writer.token().to_string();
            let outcome = writer.write(set_and_log(&resource, &value)).await.unwrap();
            assert!(outcome.is_accepted(), "{outcome:?}");
            (guard.fencing_token(), guard)
        }
    })
    .await;
    assert_eq!(
        s.log(&resource).await,
        tokens.iter().map(|t| t.to_string()).collect::<Vec<_>>()
    );
    // The first holder, had it been paused and written late, is refused.
    let late = Fenced::new(&s.fence, resource.clone(), tokens[0]);
    assert_eq!(
        late.write(set_and_log(&resource, "late")).await.unwrap(),
        Outcome::Stale { last: tokens[2] }
    );
}

#[tokio::test]
async fn the_last_token_survives_a_restart_of_the_server() {
    let mut zk = server();
    let s = ZkSubject::new(&zk.connect_string()).await;
    let (old, new) = (FencingToken::new(70, 0), FencingToken::new(70, 1));
    assert_eq!(s.write("doc", new, "after").await, Outcome::Accepted(()));
    drop(s);
    zk.restart().expect("restart ZooKeeper");
    let s = ZkSubject::new(&zk.connect_string()).await;
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
    let zk = server();
    let s = ZkSubject::new(&zk.connect_string()).await;
    s.prepare("doc").await;
    let err = s
        .fence
        .fenced_write("doc", FencingToken::NONE, set_and_log("doc", "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::NoToken { .. }), "{err}");
    assert_eq!(s.last("doc").await, None);
    assert_eq!(s.value("doc").await, None);
}
