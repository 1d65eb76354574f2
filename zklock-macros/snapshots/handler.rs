// A typical handler: while the stock of one SKU is read, checked and written, no other instance
// of the service runs this for the same SKU. The expansion is in `handler.expanded.rs`.
use std::sync::LazyLock;

use zklock::LockManager;

static LOCKS: LazyLock<LockManager> = LazyLock::new(|| unimplemented!("connected at start-up"));

pub struct Order {
    pub id: u64,
    pub sku: String,
    pub quantity: u32,
}

#[derive(Debug)]
pub enum ShopError {
    OutOfStock,
    Lock(zklock::Error),
}

impl From<zklock::Error> for ShopError {
    fn from(err: zklock::Error) -> ShopError {
        ShopError::Lock(err)
    }
}

pub struct Store;

impl Store {
    async fn stock(&self, _sku: &str) -> Result<u32, ShopError> {
        Ok(1)
    }

    async fn set_stock(&self, _sku: &str, _stock: u32) -> Result<(), ShopError> {
        Ok(())
    }
}

/// Sells `order.quantity` items of `order.sku`, if in stock. Waits at most 5 s for the lock.
#[zklock::distributed_lock("sku_{order.sku}", timeout = "5s", manager = LOCKS)]
pub async fn place_order(store: &Store, order: Order) -> Result<u64, ShopError> {
    let stock = store.stock(&order.sku).await?;
    if stock < order.quantity {
        return Err(ShopError::OutOfStock);
    }
    store.set_stock(&order.sku, stock - order.quantity).await?;
    Ok(order.id)
}

fn main() {
    let _ = place_order;
}
