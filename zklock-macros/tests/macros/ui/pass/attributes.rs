//! Other attributes, docs, visibility and inner attributes are kept.
use zklock::{distributed_lock, Error};

pub mod api {
    use super::*;

    /// Documented.
    #[must_use = "the lock is taken only when awaited"]
    #[distributed_lock("user_{id}")]
    #[allow(clippy::needless_return)]
    pub(crate) async fn handler(id: u64) -> Result<u64, Error> {
        #![allow(unused_variables)]
        let unused = 1;
        return Ok(id);
    }
}

fn main() {
    let _ = api::handler(1);
}
