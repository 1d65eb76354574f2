// More forms: a method whose manager is a field, a read lock, a literal key with the global
// manager and `on_lost = "continue"`, and a renamed crate.
extern crate zklock as locks;

use zklock::{Error, LockManager};

pub struct Catalog {
    locks: LockManager,
    region: String,
}

impl Catalog {
    /// Reads an item of this region; readers share the lock, a writer excludes them.
    #[zklock::distributed_lock("catalog_{self.region}_{id}", mode = "read", manager = self.locks)]
    pub async fn item(&self, id: u32) -> Result<String, Error> {
        Ok(format!("{}:{id}", self.region))
    }
}

/// The nightly job, on the global manager; a lost hold does not stop it.
#[zklock::distributed_lock("nightly", on_lost = "continue", timeout = "1m30s")]
pub async fn nightly() -> zklock::Result<()> {
    Ok(())
}

/// The same crate under another name.
#[locks::distributed_lock("user_<id>", crate = "locks")]
pub async fn renamed(id: u64) -> locks::Result<u64> {
    Ok(id)
}

fn main() {
    let _ = (Catalog::item, nightly, renamed);
}
