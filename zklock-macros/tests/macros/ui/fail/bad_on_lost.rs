use zklock::distributed_lock;

#[distributed_lock("user_{id}", on_lost = "ignore")]
async fn handler(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

fn main() {}
