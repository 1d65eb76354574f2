use zklock::{distributed_lock, Error, Ran};

#[distributed_lock("nightly", skip_if_locked, timeout = "5s")]
async fn skip_and_wait() -> Result<Ran<()>, Error> {
    Ok(())
}

#[distributed_lock("nightly", at_least = "30s", at_most = "10m")]
async fn neither_skip_nor_timeout() -> Result<Ran<()>, Error> {
    Ok(())
}

#[distributed_lock("nightly", skip_if_locked, mode = "read", on_lost = "continue")]
async fn shared_and_unstoppable() -> Result<Ran<()>, Error> {
    Ok(())
}

#[distributed_lock("nightly", skip_if_locked = true)]
async fn flag_with_a_value() -> Result<Ran<()>, Error> {
    Ok(())
}

#[distributed_lock("nightly", skip_if_locked, skip_if_locked)]
async fn twice() -> Result<Ran<()>, Error> {
    Ok(())
}

fn main() {}
