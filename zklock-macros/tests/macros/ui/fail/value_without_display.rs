use zklock::distributed_lock;

struct Order {
    id: u64,
}

#[distributed_lock("order_{order}")]
async fn handler(order: Order) -> Result<u64, zklock::Error> {
    Ok(order.id)
}

fn main() {}
