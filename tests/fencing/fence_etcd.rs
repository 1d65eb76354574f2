//! The etcd fence (`EtcdFence`) against a real etcd (the test kit's): a fenced transaction is
//! applied with its token recorded in the same revision, the first time on an absent token key
//! too; an equal token passes again; an older one (also an older local handoff of the same
//! grant) is refused naming the newest token, and nothing of it is written; concurrent writers
//! on their own connections end with the newest token's write, and etcd's history of the token
//! key and the user's key never shows a smaller token applied after a larger one or the two keys
//! changed apart; resource names with odd characters get token keys of their own; and the last
//! token survives a restart.
//!
//! Tokens are made with `FencingToken::new(grant, local)` (the etcd lock backend is not there
//! yet to hand them out).

use crate::fence;

use std::collections::BTreeSet;

use etcd_client::{Client, GetOptions, KeyValue, TxnOp, TxnOpResponse};
use zklock::fence::{EtcdFence, EtcdWrite, Fence, FenceError, Fenced, Outcome};
use zklock::FencingToken;
use zklock_testkit::EtcdServer;

use fence::Subject;

struct EtcdSubject {
    url: String,
    client: Client,
    fence: EtcdFence,
}

async fn connect(url: &str) -> Client {
    Client::connect([url], None)
        .await
        .expect("connect to the test etcd")
}

/// The test's own key of a resource's value.
fn value_key(resource: &str) -> String {
    format!("app/data/{resource}")
}

/// The prefix of a resource's log: one key per written value.
fn log_prefix(resource: &str) -> String {
    format!("app/log/{resource}/")
}

/// The fenced write of the scenarios: the value key set and a log key made, in one transaction.
fn set_and_log(resource: &str, value: &str) -> EtcdWrite {
    EtcdWrite::new()
        .put(value_key(resource), value)
        .put(format!("{}{value}", log_prefix(resource)), value)
}

fn t(grant: i64, local: u32) -> FencingToken {
    FencingToken::new(grant, local)
}

impl EtcdSubject {
    async fn new(url: &str) -> EtcdSubject {
        let client = connect(url).await;
        EtcdSubject {
            url: url.to_string(),
            fence: EtcdFence::new(client.clone()),
            client,
        }
    }

    /// The key-value at `key` (at `revision`, or now), read around the fence.
    async fn raw(&self, key: impl Into<Vec<u8>>, revision: Option<i64>) -> Option<KeyValue> {
        let options = revision.map(|r| GetOptions::new().with_revision(r));
        let mut reply = self.client.clone().get(key, options).await.unwrap();
        reply.take_kvs().into_iter().next()
    }

    async fn raw_str(&self, key: &str) -> Option<String> {
        self.raw(key, None)
            .await
            .map(|kv| kv.value_str().unwrap().to_string())
    }

    async fn put_raw(&self, key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) {
        self.client.clone().put(key, value, None).await.unwrap();
    }

    /// The store's revision: it moves with every write, and only with a write.
    async fn revision(&self) -> i64 {
        let reply = self.client.clone().get("app/none", None).await.unwrap();
        reply.header().unwrap().revision()
    }
}

impl Subject for EtcdSubject {
    async fn another(&self) -> Self {
        EtcdSubject::new(&self.url).await
    }

    async fn write(&self, resource: &str, token: FencingToken, value: &str) -> Outcome {
        self.fence
            .fenced_write(resource, token, set_and_log(resource, value))
            .await
            .unwrap()
            .map(|responses| assert_eq!(responses.len(), 2, "the responses of the two puts"))
    }

    async fn value(&self, resource: &str) -> Option<String> {
        self.raw_str(&value_key(resource)).await
    }

    /// The logged values in the order etcd applied them (by the revision that wrote each).
    async fn log(&self, resource: &str) -> Vec<String> {
        let options = GetOptions::new().with_prefix();
        let mut reply = self
            .client
            .clone()
            .get(log_prefix(resource), Some(options))
            .await
            .unwrap();
        let mut kvs = reply.take_kvs();
        kvs.sort_by_key(|kv| kv.mod_revision());
        kvs.iter()
            .map(|kv| kv.value_str().unwrap().to_string())
            .collect()
    }

    async fn last(&self, resource: &str) -> Option<FencingToken> {
        self.fence.last_token(resource).await.unwrap()
    }
}

fn server() -> EtcdServer {
    EtcdServer::start().expect("start etcd (see the test kit's error)")
}

#[tokio::test]
async fn a_first_write_on_an_absent_token_key_is_applied_with_its_token_in_one_revision() {
    let etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    s.put_raw("app/reserved/sku_1", "order-1").await;
    let token_key = s.fence.key_of("sku_1");
    assert_eq!(token_key, "zklock/fence/sku_1");
    assert!(s.raw(token_key.clone(), None).await.is_none());
    assert_eq!(s.last("sku_1").await, None);

    let token = t(42, 0);
    let write = EtcdWrite::new()
        .put("app/stock/sku_1", "41")
        .delete("app/reserved/sku_1");
    let outcome = s.fence.fenced_write("sku_1", token, write).await.unwrap();
    let Outcome::Accepted(responses) = outcome else {
        panic!("the first write was refused: {outcome:?}")
    };
    // Your operations' responses, in order, without the fence's own put.
    assert_eq!(responses.len(), 2);
    assert!(matches!(responses[0], TxnOpResponse::Put(_)));
    let TxnOpResponse::Delete(deleted) = &responses[1] else {
        panic!("{:?}", responses[1])
    };
    assert_eq!(deleted.deleted(), 1);

    assert_eq!(s.raw_str("app/stock/sku_1").await.as_deref(), Some("41"));
    assert_eq!(s.raw_str("app/reserved/sku_1").await, None);
    let recorded = s.raw(token_key, None).await.unwrap();
    assert_eq!(recorded.value(), token.to_sortable_bytes());
    assert_eq!(s.last("sku_1").await, Some(token));
    // The token and your write are one transaction: one revision.
    let stock = s.raw("app/stock/sku_1", None).await.unwrap();
    assert_eq!(recorded.mod_revision(), stock.mod_revision());
    assert_eq!(recorded.create_revision(), stock.mod_revision());
}

#[tokio::test]
async fn an_equal_token_is_accepted_again() {
    let etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    let token = t(7, 3);
    assert_eq!(s.write("doc", token, "first").await, Outcome::Accepted(()));
    let before = s.raw(s.fence.key_of("doc"), None).await.unwrap();
    // The same hold writes again.
    assert_eq!(s.write("doc", token, "second").await, Outcome::Accepted(()));
    assert_eq!(s.value("doc").await.as_deref(), Some("second"));
    assert_eq!(s.log("doc").await, ["first", "second"]);
    assert_eq!(s.last("doc").await, Some(token));
    let after = s.raw(s.fence.key_of("doc"), None).await.unwrap();
    assert!(after.mod_revision() > before.mod_revision());
    // And the next hold of the same grant, handed over locally, too.
    assert_eq!(
        s.write("doc", t(7, 4), "third").await,
        Outcome::Accepted(())
    );
    assert_eq!(s.value("doc").await.as_deref(), Some("third"));
}

#[tokio::test]
async fn an_older_token_is_refused_naming_the_newest_and_writes_nothing() {
    let etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    s.put_raw("app/reserved/sku_3", "order-1").await;
    let newest = t(9, 2);
    let outcome = s
        .fence
        .fenced_write(
            "sku_3",
            newest,
            EtcdWrite::new().put("app/stock/sku_3", "10"),
        )
        .await
        .unwrap();
    assert!(outcome.is_accepted(), "{outcome:?}");
    let token_kv = s.raw(s.fence.key_of("sku_3"), None).await.unwrap();
    let revision = s.revision().await;

    // An earlier local handoff of the same grant, an earlier grant with a larger local count,
    // a negative grant: all older.
    for older in [t(9, 1), t(9, 0), t(8, u32::MAX), t(-1, 5)] {
        let late = EtcdWrite::new()
            .put("app/stock/sku_3", "99")
            .delete("app/reserved/sku_3")
            .put("app/new/sku_3", "x");
        let outcome = s.fence.fenced_write("sku_3", older, late).await.unwrap();
        assert_eq!(
            outcome.map(|_| ()),
            Outcome::Stale { last: newest },
            "{older}"
        );
    }
    // Nothing was written: no new revision at all, every key as it was.
    assert_eq!(s.revision().await, revision);
    assert_eq!(s.raw_str("app/stock/sku_3").await.as_deref(), Some("10"));
    assert_eq!(
        s.raw_str("app/reserved/sku_3").await.as_deref(),
        Some("order-1")
    );
    assert_eq!(s.raw_str("app/new/sku_3").await, None);
    let after = s.raw(s.fence.key_of("sku_3"), None).await.unwrap();
    assert_eq!(after.value(), newest.to_sortable_bytes());
    assert_eq!(after.mod_revision(), token_kv.mod_revision());

    // Through a writer, as a guard's would be.
    let writer = Fenced::new(&s.fence, "sku_3", t(9, 1));
    assert_eq!(
        writer.write(EtcdWrite::new()).await.unwrap().map(|_| ()),
        Outcome::Stale { last: newest }
    );
    assert_eq!(writer.last().await.unwrap(), Some(newest));
}

#[tokio::test]
async fn the_scenario_of_every_store_older_refused_newer_and_equal_accepted() {
    let etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    fence::older_refused_newer_accepted(&s, "sku_1").await;
    // The token key holds the 12 sortable bytes etcd compared.
    let raw = s.raw("zklock/fence/sku_1", None).await.unwrap();
    assert_eq!(
        raw.value(),
        FencingToken::new((1 << 53) + 1, 2).to_sortable_bytes()
    );
}

/// What etcd's history shows between two revisions for one resource: at each revision that
/// changed the token key, the user's value key changed too, to that token's value (and the
/// other way round); the tokens so recorded, in revision order.
async fn recorded_history(
    s: &EtcdSubject,
    resource: &str,
    from: i64,
    to: i64,
) -> Vec<FencingToken> {
    let token_key = s.fence.key_of(resource);
    let mut tokens = Vec::new();
    for rev in from + 1..=to {
        let token_kv = s.raw(token_key.clone(), Some(rev)).await;
        let value_kv = s.raw(value_key(resource), Some(rev)).await;
        let token_changed = token_kv.as_ref().filter(|kv| kv.mod_revision() == rev);
        let value_changed = value_kv.as_ref().filter(|kv| kv.mod_revision() == rev);
        match (token_changed, value_changed) {
            (None, None) => {}
            (Some(token), Some(value)) => {
                let token = FencingToken::from_sortable_bytes(token.value()).unwrap();
                assert_eq!(
                    value.value_str().unwrap(),
                    token.to_string(),
                    "revision {rev}: the value of another token"
                );
                tokens.push(token);
            }
            (token, value) => {
                panic!("revision {rev} changed one key without the other: {token:?} {value:?}")
            }
        }
    }
    tokens
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_writers_end_with_the_largest_tokens_write_and_never_go_back() {
    let etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    // 24: every token the helper draws from (6 grants, 4 local counts).
    for (seed, writers) in [(0, 8), (1, 8), (2, 8), (3, 8), (4, 8), (5, 24)] {
        let resource = format!("hot_{seed}");
        let from = s.revision().await;
        // 8 connections, random tokens over few grants (so many differ only in their local
        // count), started together; checks the outcomes, the log, the value, the last token.
        fence::concurrent_writers(&s, &resource, writers, 8, seed).await;
        let to = s.revision().await;
        let history = recorded_history(&s, &resource, from, to).await;
        assert!(
            history.windows(2).all(|w| w[0] < w[1]),
            "seed {seed}: a token was recorded after a larger one: {history:?}"
        );
        let logged: BTreeSet<FencingToken> = s
            .log(&resource)
            .await
            .iter()
            .map(|v| fence::parse_display(v))
            .collect();
        assert_eq!(
            history.iter().copied().collect::<BTreeSet<_>>(),
            logged,
            "seed {seed}: every recorded token is an accepted write's"
        );
        assert_eq!(history.last(), s.last(&resource).await.as_ref());
    }
}

#[tokio::test]
async fn resources_with_odd_characters_have_token_keys_of_their_own() {
    let etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    // Names that an escaping, a trimming or a prefix read could merge. Each gets a token older
    // than the one before: all pass only if each has a token key of its own.
    let names = [
        "sku", "sku/", "sku/x", "sku 7", "sku_7", "sku%207", "sku\0", "SKU",
    ];
    for (i, name) in names.iter().enumerate() {
        let token = t(100 - i as i64, 0);
        let outcome = s
            .fence
            .fenced_write(name, token, EtcdWrite::new().put(value_key(name), *name))
            .await
            .unwrap();
        assert_eq!(outcome.map(|_| ()), Outcome::Accepted(()), "{name:?}");
    }
    for (i, name) in names.iter().enumerate() {
        assert_eq!(s.last(name).await, Some(t(100 - i as i64, 0)), "{name:?}");
        assert_eq!(s.value(name).await.as_deref(), Some(*name));
    }

    let odd = "/zklock/locks/sku 7/ü€☃/%2F/*?[x]\\\"'\n\t\0end";
    fence::older_refused_newer_accepted(&s, odd).await;
    let expected = format!("zklock/fence/{odd}");
    assert_eq!(s.fence.key_of(odd), expected);
    assert!(s.raw(expected, None).await.is_some());
}

#[tokio::test]
async fn another_prefix_keeps_the_tokens_under_it() {
    let etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    let fence = EtcdFence::new(s.client.clone()).with_prefix("shop/fence/");
    assert_eq!(fence.key_of("sku_7"), "shop/fence/sku_7");
    let token = t(3, 1);
    let outcome = fence
        .fenced_write(
            "sku_7",
            token,
            EtcdWrite::new().put("shop/stock/sku_7", "5"),
        )
        .await
        .unwrap();
    assert!(outcome.is_accepted());
    let kv = s.raw("shop/fence/sku_7", None).await.unwrap();
    assert_eq!(kv.value(), token.to_sortable_bytes());
    assert!(s.raw("zklock/fence/sku_7", None).await.is_none());
    // The default fence does not see that token: its own key is still absent.
    assert_eq!(s.last("sku_7").await, None);
    assert_eq!(fence.last_token("sku_7").await.unwrap(), Some(token));
}

#[tokio::test]
async fn refused_arguments_and_refused_transactions_write_nothing() {
    let etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    let revision = s.revision().await;
    // No token (a hold of a manager without tokens), an empty resource: refused before etcd.
    let err = s
        .fence
        .fenced_write("doc", FencingToken::NONE, set_and_log("doc", "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::NoToken { .. }), "{err}");
    let err = s
        .fence
        .fenced_write("", t(1, 0), set_and_log("doc", "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Invalid(_)), "{err}");
    assert_eq!(s.revision().await, revision);

    // An operation of yours on the token key: etcd refuses the whole transaction.
    let token = t(5, 0);
    assert_eq!(s.write("doc", token, "one").await, Outcome::Accepted(()));
    let revision = s.revision().await;
    let clash = EtcdWrite::new().put(value_key("doc"), "two").op(TxnOp::put(
        s.fence.key_of("doc"),
        "mine",
        None,
    ));
    let err = s
        .fence
        .fenced_write("doc", t(6, 0), clash)
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Etcd(_)), "{err}");
    assert!(err.to_string().contains("duplicate key"), "{err}");
    assert_eq!(s.revision().await, revision);
    assert_eq!(s.value("doc").await.as_deref(), Some("one"));
    assert_eq!(s.last("doc").await, Some(token));

    // A token key holding something else that compares above the token is reported, not
    // taken for a token.
    s.put_raw(s.fence.key_of("junk"), b"\xffjunk".to_vec())
        .await;
    let err = s.fence.last_token("junk").await.unwrap_err();
    assert!(matches!(err, FenceError::Encoding { .. }), "{err}");
    let revision = s.revision().await;
    let err = s
        .fence
        .fenced_write("junk", t(5, 0), set_and_log("junk", "x"))
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Encoding { .. }), "{err}");
    assert_eq!(s.revision().await, revision);
    assert_eq!(s.value("junk").await, None);
}

#[tokio::test]
async fn the_last_token_survives_a_restart_of_the_server() {
    let mut etcd = server();
    let s = EtcdSubject::new(&etcd.client_url()).await;
    let (old, new) = (t(70, 0), t(70, 1));
    assert_eq!(s.write("doc", new, "after").await, Outcome::Accepted(()));
    drop(s);
    etcd.restart().expect("restart etcd");
    let s = EtcdSubject::new(&etcd.client_url()).await;
    assert_eq!(
        s.write("doc", old, "stale").await,
        Outcome::Stale { last: new }
    );
    assert_eq!(s.value("doc").await.as_deref(), Some("after"));
    assert_eq!(
        s.write("doc", t(71, 0), "next").await,
        Outcome::Accepted(())
    );
}
