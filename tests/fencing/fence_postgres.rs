//! The PostgreSQL fence (`PgFence`) against a real PostgreSQL (the test kit's): one guarded
//! statement, the user's own transaction, and the SQL text for other clients each refuse older
//! tokens and accept equal and newer ones; concurrent writers on their own connections end with
//! the newest token's write; tokens of local handoffs of real PostgreSQL locks pass; and the
//! last token survives a restart of the server.

use crate::fence;

use zklock::fence::{Fence, FenceError, Fenced, Outcome, PgFence, PgWrite, ACCEPTED};
use zklock::{FencingToken, LockManager};
use zklock_testkit::PostgresServer;

use tokio_postgres::{Client, NoTls};

use fence::Subject;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fenced_value (resource text PRIMARY KEY, value text NOT NULL);
CREATE TABLE IF NOT EXISTS fenced_log (id bigserial PRIMARY KEY, resource text NOT NULL, value text NOT NULL);
";

/// The value and the log in one statement guarded by the fence ($1 resource, $2 value).
fn set_and_log() -> String {
    format!(
        "WITH v AS (INSERT INTO fenced_value (resource, value) SELECT $1, $2 WHERE {ACCEPTED} \
         ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value RETURNING 1) \
         INSERT INTO fenced_log (resource, value) SELECT $1, $2 WHERE {ACCEPTED}"
    )
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// `PgFenceOn::execute`: the guard and the write in one statement.
    Statement,
    /// `PgFenceOn::advance` in a transaction, then plain statements, then commit.
    Transaction,
}

struct PgSubject {
    url: String,
    client: Client,
    fence: PgFence,
    mode: Mode,
}

async fn connect(url: &str) -> Client {
    let (client, conn) = tokio_postgres::connect(url, NoTls)
        .await
        .expect("connect to the test PostgreSQL");
    tokio::spawn(conn);
    client
}

impl PgSubject {
    async fn new(url: &str, mode: Mode) -> PgSubject {
        let client = connect(url).await;
        let fence = PgFence::new("fence_tokens").unwrap();
        fence.create_table(&client).await.unwrap();
        client.batch_execute(SCHEMA).await.unwrap();
        PgSubject {
            url: url.to_string(),
            client,
            fence,
            mode,
        }
    }
}

impl Subject for PgSubject {
    async fn another(&self) -> Self {
        PgSubject::new(&self.url, self.mode).await
    }

    async fn write(&self, resource: &str, token: FencingToken, value: &str) -> Outcome {
        let on = self.fence.on(&self.client);
        match self.mode {
            Mode::Statement => {
                let outcome = on
                    .execute(resource, token, &set_and_log(), &[&resource, &value])
                    .await
                    .unwrap();
                if let Outcome::Accepted(rows) = outcome {
                    assert_eq!(rows, 1, "the log row");
                }
                outcome.map(|_| ())
            }
            Mode::Transaction => {
                self.client.batch_execute("BEGIN").await.unwrap();
                let outcome = on.advance(resource, token).await.unwrap();
                if outcome.is_accepted() {
                    let c = &self.client;
                    c.execute(
                        "INSERT INTO fenced_value (resource, value) VALUES ($1, $2) \
                         ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value",
                        &[&resource, &value],
                    )
                    .await
                    .unwrap();
                    c.execute(
                        "INSERT INTO fenced_log (resource, value) VALUES ($1, $2)",
                        &[&resource, &value],
                    )
                    .await
                    .unwrap();
                    c.batch_execute("COMMIT").await.unwrap();
                } else {
                    self.client.batch_execute("ROLLBACK").await.unwrap();
                }
                outcome
            }
        }
    }

    async fn value(&self, resource: &str) -> Option<String> {
        self.client
            .query_opt(
                "SELECT value FROM fenced_value WHERE resource = $1",
                &[&resource],
            )
            .await
            .unwrap()
            .map(|r| r.get(0))
    }

    async fn log(&self, resource: &str) -> Vec<String> {
        self.client
            .query(
                "SELECT value FROM fenced_log WHERE resource = $1 ORDER BY id",
                &[&resource],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    async fn last(&self, resource: &str) -> Option<FencingToken> {
        self.fence
            .on(&self.client)
            .last_token(resource)
            .await
            .unwrap()
    }
}

fn server() -> PostgresServer {
    PostgresServer::start().expect("start PostgreSQL (see the test kit's error)")
}

#[tokio::test]
async fn a_guarded_statement_refuses_older_tokens_and_accepts_newer_and_equal() {
    let pg = server();
    let s = PgSubject::new(&pg.url(), Mode::Statement).await;
    fence::older_refused_newer_accepted(&s, "sku_1").await;
}

#[tokio::test]
async fn an_advance_in_the_users_transaction_refuses_older_tokens() {
    let pg = server();
    let s = PgSubject::new(&pg.url(), Mode::Transaction).await;
    fence::older_refused_newer_accepted(&s, "sku_1").await;
}

#[tokio::test]
async fn the_sql_text_for_other_clients_guards_their_statement() {
    // What a sqlx user runs: the text and the parameters, bound by position.
    let pg = server();
    let s = PgSubject::new(&pg.url(), Mode::Statement).await;
    let sql = s
        .fence
        .guarded_sql(
            &format!(
                "INSERT INTO fenced_value (resource, value) SELECT $1, $2 WHERE {ACCEPTED} \
                 ON CONFLICT (resource) DO UPDATE SET value = EXCLUDED.value"
            ),
            2,
        )
        .unwrap();
    let run = |token: FencingToken, value: &'static str| {
        let sql = sql.clone();
        let client = &s.client;
        async move {
            let bytes = token.to_sortable_bytes().to_vec();
            client
                .execute(&sql, &[&"doc", &value, &"doc", &bytes])
                .await
                .unwrap()
        }
    };
    assert_eq!(run(FencingToken::new(8, 0), "first").await, 1);
    assert_eq!(run(FencingToken::new(8, 0), "again").await, 1);
    assert_eq!(run(FencingToken::new(7, 5), "stale").await, 0);
    assert_eq!(run(FencingToken::new(9, 0), "newer").await, 1);
    assert_eq!(s.value("doc").await.as_deref(), Some("newer"));
    // The advance statement alone: a row when accepted, none when stale.
    let advance = s.fence.advance_sql();
    let rows = |t: FencingToken| {
        let advance = advance.clone();
        let client = &s.client;
        async move {
            let bytes = t.to_sortable_bytes().to_vec();
            client
                .query(&advance, &[&"doc", &bytes])
                .await
                .unwrap()
                .len()
        }
    };
    assert_eq!(rows(FencingToken::new(8, 9)).await, 0);
    assert_eq!(rows(FencingToken::new(10, 0)).await, 1);
}

#[tokio::test]
async fn a_statement_that_ignores_the_guard_or_a_bad_table_name_is_refused() {
    let pg = server();
    let s = PgSubject::new(&pg.url(), Mode::Statement).await;
    let err = s
        .fence
        .on(&s.client)
        .execute(
            "doc",
            FencingToken::new(1, 0),
            "UPDATE fenced_value SET value = 'x'",
            &[],
        )
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::Invalid(_)), "{err}");
    assert!(err.to_string().contains(ACCEPTED), "{err}");
    assert!(PgFence::new("fence tokens").is_err());
    assert!(PgFence::new("1tokens").is_err());
    assert!(PgFence::new("a.b.c").is_err());
    // The token column takes only tokens.
    let junk = s
        .client
        .execute(
            "INSERT INTO fence_tokens (resource, token) VALUES ('junk', '\\x01')",
            &[],
        )
        .await;
    assert!(junk.is_err(), "a 1-byte token was stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_end_with_the_newest_tokens_write() {
    let pg = server();
    for (i, mode) in [Mode::Statement, Mode::Transaction].into_iter().enumerate() {
        let s = PgSubject::new(&pg.url(), mode).await;
        for seed in 0..2 {
            // One connection per writer: PostgreSQL runs them in parallel backends.
            fence::concurrent_writers(&s, &format!("hot_{i}_{seed}"), 16, 16, seed).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_of_local_handoffs_of_postgres_locks_are_fenced_in_grant_order() {
    let pg = server();
    let s = PgSubject::new(&pg.url(), Mode::Statement).await;
    let manager = LockManager::connect(&pg.url()).await.unwrap();
    let resource = manager.path_of("sku_5").unwrap();
    let on = s.fence.on(&s.client);
    let tokens = fence::local_handoffs(&manager, "sku_5", |guard| {
        let (on, resource) = (&on, resource.clone());
        async move {
            let writer = guard.fenced(on);
            assert_eq!(writer.resource(), resource);
            assert_eq!(writer.token(), guard.fencing_token());
            let value = writer.token().to_string();
            let write = PgWrite::new(set_and_log()).bind(resource).bind(value);
            let outcome = writer.write(write).await.unwrap();
            assert_eq!(outcome, Outcome::Accepted(1));
            (guard.fencing_token(), guard)
        }
    })
    .await;
    let logged = s.log(&resource).await;
    assert_eq!(
        logged,
        tokens.iter().map(|t| t.to_string()).collect::<Vec<_>>()
    );
    // The first holder, had it been paused and written late, is refused.
    let late = Fenced::new(&on, resource.clone(), tokens[0]);
    let write = PgWrite::new(set_and_log())
        .bind(resource)
        .bind("late".to_string());
    assert_eq!(
        late.write(write).await.unwrap(),
        Outcome::Stale { last: tokens[2] }
    );
}

#[tokio::test]
async fn the_last_token_survives_a_restart_of_the_server() {
    let mut pg = server();
    let s = PgSubject::new(&pg.url(), Mode::Statement).await;
    let (old, new) = (FencingToken::new(70, 0), FencingToken::new(70, 1));
    assert_eq!(s.write("doc", new, "after").await, Outcome::Accepted(()));
    drop(s);
    pg.restart().expect("restart PostgreSQL");
    let s = PgSubject::new(&pg.url(), Mode::Statement).await;
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
/// `FencingToken::NONE`, below every token: a first write would take it. Both ways of
/// writing refuse it with `NoToken` before the server is asked, and nothing is written.
#[tokio::test]
async fn no_token_is_refused_before_the_store() {
    let pg = server();
    let s = PgSubject::new(&pg.url(), Mode::Statement).await;
    let on = s.fence.on(&s.client);
    let err = on
        .execute("doc", FencingToken::NONE, &set_and_log(), &[&"doc", &"x"])
        .await
        .unwrap_err();
    assert!(matches!(err, FenceError::NoToken { .. }), "{err}");
    let err = on.advance("doc", FencingToken::NONE).await.unwrap_err();
    assert!(matches!(err, FenceError::NoToken { .. }), "{err}");
    assert_eq!(s.last("doc").await, None);
    assert_eq!(s.value("doc").await, None);
}
