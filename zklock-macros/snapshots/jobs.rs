// Scheduled jobs: a skip comes back as `Ran::Skipped` when the fn returns `Result<Ran<T>, E>`,
// else as `Err(Error::JobSkipped { .. }.into())`.
use zklock::{Error, LockManager, Ran};

/// Every instance calls it; one runs it, and nobody again within 30 s of that run's start.
#[zklock::distributed_lock("digest_{day}", skip_if_locked, at_least = "30s", at_most = "10m", manager = locks)]
pub async fn digest(locks: &LockManager, day: u32) -> Result<Ran<usize>, Error> {
    Ok(day as usize)
}

/// Waits up to 2 s for the job, then skips with an error.
#[zklock::distributed_lock("invoices", timeout = "2s", at_most = "1m30s")]
pub async fn invoices() -> zklock::Result<u32> {
    Ok(7)
}

fn main() {
    let _ = (digest, invoices);
}
