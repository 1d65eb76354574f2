use zklock::distributed_lock;

#[distributed_lock("user_{id}")]
async fn handler(id: u64) {
    let _ = id;
}

fn main() {}
