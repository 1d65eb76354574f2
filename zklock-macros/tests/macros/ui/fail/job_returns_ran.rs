use zklock::{distributed_lock, Ran};

#[distributed_lock("nightly", skip_if_locked)]
async fn nightly() -> Ran<u64> {
    Ran::Ran(1)
}

fn main() {}
