use zklock::distributed_lock;

#[distributed_lock]
async fn no_arguments(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock(timeout = "1s")]
async fn options_only(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

fn main() {}
