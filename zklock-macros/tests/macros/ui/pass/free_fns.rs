//! Free fns with each kind of error type, and the default (global) manager.
use zklock::distributed_lock;

#[derive(Debug)]
enum AppError {
    Lock(zklock::Error),
    NotFound,
}

impl From<zklock::Error> for AppError {
    fn from(err: zklock::Error) -> AppError {
        AppError::Lock(err)
    }
}

type AppResult<T> = Result<T, AppError>;

#[distributed_lock("user_{id}")]
async fn zklock_error(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user_{id}")]
async fn zklock_result(id: u64) -> zklock::Result<()> {
    let _ = id;
    Ok(())
}

#[distributed_lock("user_{id}")]
async fn own_error(id: u64) -> Result<String, AppError> {
    if id == 0 {
        return Err(AppError::NotFound);
    }
    let name = lookup(id).await?;
    Ok(name)
}

#[distributed_lock("user_{id}")]
async fn alias(id: u64) -> AppResult<()> {
    let _ = id;
    Ok(())
}

#[distributed_lock("user_{id}")]
async fn std_result(id: u64) -> std::result::Result<(), AppError> {
    let _ = id;
    Ok(())
}

#[distributed_lock("user_{id}")]
async fn boxed(id: u64) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
    let _: u32 = "7".parse()?;
    let _ = id;
    Ok(())
}

#[distributed_lock("nightly-report")]
pub async fn no_parameters() -> Result<(), zklock::Error> {
    Ok(())
}

#[distributed_lock("user_{id}")]
async fn opaque(id: u64) -> Result<impl std::fmt::Display, zklock::Error> {
    Ok(id)
}

async fn lookup(id: u64) -> Result<String, AppError> {
    Ok(id.to_string())
}

fn main() {
    let _ = (zklock_error(1), zklock_result(1), own_error(1), alias(1));
    let _ = (std_result(1), boxed(1), no_parameters(), opaque(1));
}
