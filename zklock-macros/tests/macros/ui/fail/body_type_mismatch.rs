use zklock::distributed_lock;

#[distributed_lock("user_{id}")]
async fn handler(id: u64) -> Result<u64, zklock::Error> {
    Ok(id > 7)
}

fn main() {}
