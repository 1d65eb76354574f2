//! Every accepted form of a scheduled job: how a skip comes back follows the return type.
use std::sync::LazyLock;

use zklock::{distributed_lock, Error, LockManager, Ran};

static LOCKS: LazyLock<LockManager> = LazyLock::new(|| unimplemented!());

#[derive(Debug)]
pub enum AppError {
    Lock(Error),
}

impl From<Error> for AppError {
    fn from(err: Error) -> Self {
        AppError::Lock(err)
    }
}

pub type AppResult<T> = Result<T, AppError>;

#[distributed_lock("nightly", skip_if_locked)]
async fn skip() -> Result<Ran<u64>, Error> {
    Ok(1)
}

#[distributed_lock("nightly", skip_if_locked, at_least = "30s", at_most = "10m")]
async fn all_three() -> Result<zklock::Ran<()>, Error> {
    Ok(())
}

#[distributed_lock("nightly", timeout = "2s", at_least = "1m30s")]
async fn waits_then_skips() -> zklock::Result<Ran<String>> {
    Ok("sent".into())
}

#[distributed_lock("report_{day}", skip_if_locked, at_most = "500ms", manager = LOCKS)]
async fn alias(day: u32) -> AppResult<Ran<u32>> {
    // `?` converts into the fn's error type, as in any annotated fn.
    let key = zklock::Key::new("day")?;
    let _ = key;
    Ok(day)
}

#[distributed_lock("nightly", skip_if_locked, mode = "exclusive", on_lost = "abort")]
async fn early_return(flag: bool) -> Result<Ran<u8>, AppError> {
    if flag {
        return Ok(1);
    }
    Ok(2)
}

// Without `Ran` in the return type, a skip is `Err(Error::JobSkipped { .. })`.
#[distributed_lock("invoices", at_least = "1h", skip_if_locked)]
async fn required() -> Result<u32, Error> {
    Ok(3)
}

struct Scheduler {
    locks: LockManager,
}

impl Scheduler {
    #[distributed_lock("sweep_{shard}", skip_if_locked, at_least = "5s", manager = self.locks)]
    async fn sweep(&self, shard: u16) -> Result<Ran<u16>, Error> {
        Ok(shard)
    }
}

async fn callers(s: &Scheduler) -> Result<(), AppError> {
    let _: Ran<u64> = skip().await?;
    let _: Ran<()> = all_three().await?;
    let _: Ran<String> = waits_then_skips().await?;
    let _: Ran<u32> = alias(1).await?;
    let _: Ran<u8> = early_return(true).await?;
    let _: u32 = required().await?;
    let _: Ran<u16> = s.sweep(3).await?;
    Ok(())
}

fn main() {
    let _ = callers;
}
