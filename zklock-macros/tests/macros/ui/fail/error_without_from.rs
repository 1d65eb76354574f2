use zklock::distributed_lock;

#[derive(Debug)]
struct AppError;

#[distributed_lock("user_{id}")]
async fn handler(id: u64) -> Result<u64, AppError> {
    Ok(id)
}

fn main() {}
