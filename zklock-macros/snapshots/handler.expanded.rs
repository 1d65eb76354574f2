// @generated from the file beside it by the snapshot test of zklock-macros (src/tests.rs): every #[distributed_lock] expanded.
use std::sync::LazyLock;
use zklock::LockManager;
static LOCKS: LazyLock<LockManager> = LazyLock::new(|| {
    unimplemented!("connected at start-up")
});
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
pub async fn place_order(store: &Store, order: Order) -> Result<u64, ShopError> {
    let __zklock_key = ::zklock::__private::format!("sku_{}", order.sku);
    let __zklock_manager = ::core::clone::Clone::clone(
        ::zklock::__private::AsLockManager::as_lock_manager(&(LOCKS)),
    );
    ::zklock::__private::run(
            &__zklock_manager,
            &__zklock_key,
            ::zklock::__private::Options {
                timeout: ::core::option::Option::Some(
                    ::core::time::Duration::from_secs(5),
                ),
                ..::zklock::__private::Options::new()
            },
            async move {
                #[allow(
                    unknown_lints,
                    unreachable_code,
                    clippy::diverging_sub_expression,
                    clippy::empty_loop,
                    clippy::let_unit_value,
                    clippy::needless_return
                )]
                if false {
                    let __zklock_fake_return: Result<u64, ShopError> = loop {};
                    return __zklock_fake_return;
                }
                let stock = store.stock(&order.sku).await?;
                if stock < order.quantity {
                    return Err(ShopError::OutOfStock);
                }
                store.set_stock(&order.sku, stock - order.quantity).await?;
                Ok(order.id)
            },
        )
        .await
}
fn main() {
    let _ = place_order;
}
