use zklock::{distributed_lock, Error, Ran};

#[distributed_lock("nightly", skip_if_locked, at_least = "30 secs")]
async fn words() -> Result<Ran<()>, Error> {
    Ok(())
}

#[distributed_lock("nightly", skip_if_locked, at_least = "0s")]
async fn zero_window() -> Result<Ran<()>, Error> {
    Ok(())
}

#[distributed_lock("nightly", skip_if_locked, at_most = "0ms")]
async fn zero_limit() -> Result<Ran<()>, Error> {
    Ok(())
}

#[distributed_lock("nightly", skip_if_locked, at_most = 600)]
async fn not_a_string() -> Result<Ran<()>, Error> {
    Ok(())
}

fn main() {}
