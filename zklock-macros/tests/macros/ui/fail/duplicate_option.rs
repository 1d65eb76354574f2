use zklock::distributed_lock;

#[distributed_lock("user_{id}", timeout = "1s", mode = "read", timeout = "2s")]
async fn handler(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

fn main() {}
