use zklock::distributed_lock;

#[distributed_lock("user_{user_id}")]
async fn misspelled(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user_{self.id}")]
async fn no_receiver(id: u64) -> Result<u64, zklock::Error> {
    Ok(id)
}

#[distributed_lock("user_<id>")]
async fn no_parameters() -> Result<(), zklock::Error> {
    Ok(())
}

fn main() {}
