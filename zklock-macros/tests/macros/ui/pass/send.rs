//! An annotated fn's future is `Send` when its body is, so a handler can be spawned.
use zklock::{distributed_lock, Error, LockManager, Ran};

#[distributed_lock("user_{id}", manager = m, timeout = "1s")]
async fn handler(m: &LockManager, id: u64) -> Result<u64, Error> {
    tokio::task::yield_now().await;
    Ok(id)
}

#[distributed_lock("user_{id}")]
async fn with_global(id: u64) -> Result<u64, Error> {
    Ok(id)
}

#[distributed_lock("nightly", manager = m, skip_if_locked, at_least = "30s", at_most = "1m")]
async fn job(m: &LockManager) -> Result<Ran<()>, Error> {
    tokio::task::yield_now().await;
    Ok(())
}

#[distributed_lock("nightly", timeout = "1s", at_most = "1m")]
async fn required_job() -> Result<(), Error> {
    Ok(())
}

fn assert_send<F: Send>(_: F) {}

#[allow(dead_code)]
fn spawn(m: LockManager) {
    assert_send(handler(&m, 2));
    assert_send(job(&m));
    tokio::spawn(async move { handler(&m, 1).await });
    tokio::spawn(with_global(1));
    tokio::spawn(required_job());
}

fn main() {}
