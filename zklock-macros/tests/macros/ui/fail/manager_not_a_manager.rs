use zklock::distributed_lock;

#[distributed_lock("user_{id}", manager = "127.0.0.1:2181")]
async fn handler(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

fn main() {}
