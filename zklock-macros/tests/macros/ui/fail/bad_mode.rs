use zklock::distributed_lock;

#[distributed_lock("user_{id}", mode = "shared")]
async fn unknown_mode(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user_{id}", mode = read)]
async fn bare_word(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

fn main() {}
