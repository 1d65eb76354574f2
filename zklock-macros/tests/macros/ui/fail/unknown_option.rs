use zklock::distributed_lock;

#[distributed_lock("user_{id}", retries = 3)]
async fn handler(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

fn main() {}
