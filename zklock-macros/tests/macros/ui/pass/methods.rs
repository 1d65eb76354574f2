//! Inherent and trait-impl methods, every receiver, generic fns, `self` fields in the key.
use std::fmt::Display;
use std::future::Future;
use std::sync::Arc;

use zklock::{distributed_lock, Error, LockManager};

struct Accounts {
    locks: LockManager,
    region: String,
}

impl Accounts {
    #[distributed_lock("account_{id}", manager = self.locks)]
    async fn by_ref(&self, id: u64) -> Result<String, Error> {
        Ok(format!("{}:{id}", self.region))
    }

    #[distributed_lock("account_{id}", manager = self.locks)]
    async fn by_mut(&mut self, id: u64) -> Result<(), Error> {
        self.region = id.to_string();
        Ok(())
    }

    #[distributed_lock("region_{self.region}", manager = &self.locks)]
    async fn self_field(&self) -> Result<usize, Error> {
        Ok(self.region.len())
    }

    #[distributed_lock("region_{self.region}", manager = self.locks)]
    async fn by_value(self) -> Result<String, Error> {
        Ok(self.region)
    }

    #[distributed_lock("region_{self.region}", manager = self.locks)]
    async fn by_arc(self: Arc<Self>) -> Result<String, Error> {
        Ok(self.region.clone())
    }
}

trait Handler {
    fn handle(&self, id: u64) -> impl Future<Output = Result<u64, Error>> + Send;
    async fn handle_local(&self, id: u64) -> Result<u64, Error>;

    fn locks(&self) -> &LockManager;

    /// A provided method of the trait itself.
    #[distributed_lock("default_{id}", manager = self.locks())]
    async fn provided(&self, id: u64) -> Result<u64, Error> {
        Ok(id)
    }
}

impl Handler for Accounts {
    #[distributed_lock("account_{id}", manager = self.locks)]
    async fn handle(&self, id: u64) -> Result<u64, Error> {
        Ok(id)
    }

    #[distributed_lock("account_{id}", manager = self.locks)]
    async fn handle_local(&self, id: u64) -> Result<u64, Error> {
        Ok(id)
    }

    fn locks(&self) -> &LockManager {
        &self.locks
    }
}

#[distributed_lock("item_{key}", manager = locks)]
async fn generic<K, V>(locks: &LockManager, key: K, value: V) -> Result<V, Error>
where
    K: Display + Send,
    V: Clone + Send,
{
    let _ = key;
    Ok(value.clone())
}

#[distributed_lock("item_{key}", manager = locks)]
async fn lifetimes<'a>(locks: &LockManager, key: &'a str) -> Result<&'a str, Error> {
    Ok(key)
}

fn main() {
    let _ = (Accounts::by_ref, Accounts::by_mut, Accounts::self_field);
    let _ = (Accounts::by_value, Accounts::by_arc);
    let _ = (
        <Accounts as Handler>::handle,
        <Accounts as Handler>::handle_local,
        <Accounts as Handler>::provided,
    );
    let _ = (generic::<u64, String>, lifetimes);
}
