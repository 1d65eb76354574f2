//! A fenced row in PostgreSQL: a holder whose lock ran out while it was paused cannot
//! overwrite what the next holder wrote.
//!
//! Two instances update one account's balance under the lock `account_1` (on PostgreSQL too,
//! with a short lease). Instance A takes the lock and reads the balance, then stops before
//! writing (as a GC pause or a frozen VM would stop it) until its lease has run out. Instance
//! B then takes the lock, reads, writes. When A wakes up it writes what it computed from its
//! stale read, with its old token: the fence refuses it. Without the fence, B's deposit would
//! be lost.
//!
//! `cargo run --example fenced_postgres` (starts its own PostgreSQL; or set
//! `ZKLOCK_POSTGRES_URL=postgres://user@host/db` to use yours).

mod common;

use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};
use zklock::fence::{Outcome, PgFence, PgWrite, ACCEPTED};
use zklock::LockManager;

/// How long a hold lasts unless renewed; A's pause is longer.
const LEASE: Duration = Duration::from_secs(2);

/// What happened, for the output and for `tests/fencing/fence_postgres_example.rs`.
#[derive(Debug)]
pub struct Report {
    /// A's token and what the fence did with A's late write.
    pub paused: (zklock::FencingToken, Outcome<u64>),
    /// B's token and what the fence did with B's write.
    pub next: (zklock::FencingToken, Outcome<u64>),
    /// The balance at the end.
    pub balance: i64,
}

async fn connect(url: &str) -> Result<Client, Box<dyn std::error::Error>> {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(connection);
    Ok(client)
}

async fn balance(client: &Client) -> Result<i64, Box<dyn std::error::Error>> {
    let row = client
        .query_one("SELECT balance FROM accounts WHERE id = 'account_1'", &[])
        .await?;
    Ok(row.get(0))
}

/// The fenced update of the example: the balance, only if the writer's token is not older
/// than the last one accepted for the account's lock.
fn set_balance(balance: i64) -> PgWrite {
    PgWrite::new(format!(
        "UPDATE accounts SET balance = $1 WHERE id = 'account_1' AND {ACCEPTED}"
    ))
    .bind(balance)
}

/// Runs the scenario against the PostgreSQL at `url`.
pub async fn run(url: &str) -> Result<Report, Box<dyn std::error::Error>> {
    let client = connect(url).await?;
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS accounts (id text PRIMARY KEY, balance bigint NOT NULL);
         INSERT INTO accounts VALUES ('account_1', 100)
           ON CONFLICT (id) DO UPDATE SET balance = 100;",
        )
        .await?;
    let fence = PgFence::new("zklock_fence_tokens")?;
    fence.create_table(&client).await?;
    let db = fence.on(&client);

    // Two instances, each its own lock manager (its own connection to the lock service).
    let a = LockManager::builder(url)
        .postgres(|pg| pg.lease(LEASE))
        .connect()
        .await?;
    let b = LockManager::builder(url)
        .postgres(|pg| pg.lease(LEASE))
        .connect()
        .await?;

    // A: lock, read, compute a withdrawal of 30 ... and stop before writing.
    let a_guard = a.lock("account_1").await?;
    let a_read = balance(&client).await?;
    let a_writer = a_guard.fenced(&db);
    println!(
        "A holds account_1 with token {}, reads {a_read}, will write {}",
        a_writer.token(),
        a_read - 30
    );
    // The pause: A's process is frozen, so nothing renews its lease. Here its hold is given
    // up instead, which looks the same to everyone else; A keeps its writer and token.
    let paused_at = Instant::now();
    drop(a_guard);

    // B: gets the lock once A's hold is gone, deposits 50.
    let b_guard = b.lock("account_1").await?;
    let b_read = balance(&client).await?;
    let b_writer = b_guard.fenced(&db);
    let b_outcome = b_writer.write(set_balance(b_read + 50)).await?;
    println!(
        "B holds account_1 with token {}, reads {b_read}, writes {}: {b_outcome:?}",
        b_writer.token(),
        b_read + 50
    );
    b_guard.release().await?;

    // A wakes up and writes what it computed before the pause, with its old token.
    tokio::time::sleep(LEASE.saturating_sub(paused_at.elapsed())).await;
    let a_outcome = a_writer.write(set_balance(a_read - 30)).await?;
    match a_outcome {
        Outcome::Stale { last } => println!(
            "A writes {} with token {}: REFUSED, the store had token {last}",
            a_read - 30,
            a_writer.token()
        ),
        Outcome::Accepted(rows) => println!("A's stale write was applied ({rows} rows)!"),
    }
    let report = Report {
        paused: (a_writer.token(), a_outcome),
        next: (b_writer.token(), b_outcome),
        balance: balance(&client).await?,
    };
    println!(
        "balance: {} (100 + 50; A's withdrawal was refused)",
        report.balance
    );

    // The same guard for another client (sqlx, diesel): the statement text, to which you bind
    // your parameters, then the resource and the token's bytes.
    let sql = fence.guarded_sql(
        &format!("UPDATE accounts SET balance = $1 WHERE id = $2 AND {ACCEPTED}"),
        2,
    )?;
    println!("for sqlx: {sql}");
    Ok(report)
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (_server, url) = common::postgres();
    let report = run(&url).await?;
    if report.paused.1.is_accepted() || report.balance != 150 {
        return Err(format!("the fence let a stale write through: {report:?}").into());
    }
    Ok(())
}
