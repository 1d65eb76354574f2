use zklock::distributed_lock;

#[distributed_lock("user_{id}", timeout = "5 secs")]
async fn words(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user_{id}", timeout = "1.5s")]
async fn fraction(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user_{id}", timeout = 5)]
async fn not_a_string(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

fn main() {}
