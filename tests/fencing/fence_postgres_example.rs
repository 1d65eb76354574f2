//! The fenced PostgreSQL example (`examples/fenced_postgres.rs`), run against a real
//! PostgreSQL: the paused holder's late write is refused, the next holder's deposit stays.

#[allow(dead_code)]
#[path = "../../examples/fenced_postgres.rs"]
mod example;

use zklock::fence::Outcome;
use zklock_testkit::PostgresServer;

#[tokio::test]
async fn the_paused_holders_write_is_refused_and_the_deposit_stays() {
    let pg = PostgresServer::start().expect("start PostgreSQL");
    let report = example::run(&pg.url()).await.unwrap();
    let (a_token, a_outcome) = report.paused;
    let (b_token, b_outcome) = report.next;
    assert!(a_token < b_token, "{report:?}");
    assert_eq!(b_outcome, Outcome::Accepted(1));
    assert_eq!(a_outcome, Outcome::Stale { last: b_token });
    assert_eq!(report.balance, 150);
}
