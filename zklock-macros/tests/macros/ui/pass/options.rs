//! Every option and every form of manager.
use std::sync::{Arc, LazyLock};

use zklock::{distributed_lock, Error, LockManager};

static LOCKS: LazyLock<LockManager> = LazyLock::new(|| unimplemented!());
static ONCE_CELL_LOCKS: once_cell::sync::Lazy<LockManager> =
    once_cell::sync::Lazy::new(|| unimplemented!());

#[distributed_lock("k", mode = "exclusive")]
async fn exclusive() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", mode = "read")]
async fn read() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", mode = "write")]
async fn write() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", timeout = "500ms")]
async fn millis() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", timeout = "1m30s")]
async fn compound() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", on_lost = "abort")]
async fn abort() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", on_lost = "continue")]
async fn carry_on() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", manager = LOCKS)]
async fn std_lazy_static() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", manager = ONCE_CELL_LOCKS)]
async fn once_cell_static() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", manager = m)]
async fn by_reference(m: &LockManager) -> Result<(), Error> {
    Ok(())
}

#[distributed_lock("k", manager = m)]
async fn owned_and_moved_into_the_body(m: LockManager) -> Result<LockManager, Error> {
    Ok(m)
}

#[distributed_lock("k", manager = m)]
async fn arc(m: Arc<LockManager>) -> Result<(), Error> {
    let _ = m;
    Ok(())
}

fn locks() -> &'static LockManager {
    &LOCKS
}

#[distributed_lock("k", manager = locks())]
async fn call() -> Result<(), Error> {
    Ok(())
}

#[distributed_lock(
    "k_{id}",
    mode = "write",
    timeout = "5s",
    manager = LOCKS,
    on_lost = "continue",
    crate = "zklock",
)]
async fn everything(id: u64) -> Result<u64, Error> {
    Ok(id)
}

fn main() {
    let _ = (
        exclusive(),
        read(),
        write(),
        millis(),
        compound(),
        abort(),
        carry_on(),
    );
    let _ = (std_lazy_static(), once_cell_static(), call(), everything(1));
    let _ = (by_reference, owned_and_moved_into_the_body, arc);
}
