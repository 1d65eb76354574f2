use zklock::distributed_lock;

#[distributed_lock("user_{id")]
async fn unclosed(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user}_{id}")]
async fn unmatched(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user_{}")]
async fn empty_placeholder(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user_{id:>8}")]
async fn format_spec(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("")]
async fn empty(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

fn main() {}
