use zklock::{distributed_lock, Error, Ran};

// The body returns the value; the attribute wraps it in `Ran::Ran`.
#[distributed_lock("nightly", skip_if_locked)]
async fn nightly() -> Result<Ran<u64>, Error> {
    Ok(Ran::Ran(1))
}

fn main() {}
