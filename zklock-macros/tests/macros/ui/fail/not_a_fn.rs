use zklock::distributed_lock;

#[distributed_lock("user")]
struct User;

fn main() {}
