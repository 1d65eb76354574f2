//! `crate = "..."` names zklock under another name.
extern crate zklock as locks;

#[locks::distributed_lock("user_{id}", crate = "locks")]
async fn renamed(id: u64) -> Result<u64, locks::Error> {
    Ok(id)
}

#[locks::distributed_lock("user_{id}", crate = "::zklock")]
async fn absolute(id: u64) -> Result<u64, locks::Error> {
    Ok(id)
}

fn main() {
    let _ = (renamed(1), absolute(1));
}
