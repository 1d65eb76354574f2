// @generated from the file beside it by the snapshot test of zklock-macros (src/tests.rs): every #[distributed_lock] expanded.
extern crate zklock as locks;
use zklock::{Error, LockManager};
pub struct Catalog {
    locks: LockManager,
    region: String,
}
impl Catalog {
    /// Reads an item of this region; readers share the lock, a writer excludes them.
    pub async fn item(&self, id: u32) -> Result<String, Error> {
        let __zklock_key = ::zklock::__private::format!(
            "catalog_{}_{}", self.region, id
        );
        let __zklock_manager = ::core::clone::Clone::clone(
            ::zklock::__private::AsLockManager::as_lock_manager(&(self.locks)),
        );
        ::zklock::__private::run(
                &__zklock_manager,
                &__zklock_key,
                ::zklock::__private::Options {
                    mode: ::zklock::__private::Mode::Read,
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
                        let __zklock_fake_return: Result<String, Error> = loop {};
                        return __zklock_fake_return;
                    }
                    Ok(format!("{}:{id}", self.region))
                },
            )
            .await
    }
}
/// The nightly job, on the global manager; a lost hold does not stop it.
pub async fn nightly() -> zklock::Result<()> {
    let __zklock_key = ::std::string::String::from("nightly");
    let __zklock_manager = ::zklock::__private::global().await?;
    ::zklock::__private::run(
            &__zklock_manager,
            &__zklock_key,
            ::zklock::__private::Options {
                timeout: ::core::option::Option::Some(
                    ::core::time::Duration::from_secs(90),
                ),
                on_lost: ::zklock::__private::OnLost::Continue,
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
                    let __zklock_fake_return: zklock::Result<()> = loop {};
                    return __zklock_fake_return;
                }
                Ok(())
            },
        )
        .await
}
/// The same crate under another name.
pub async fn renamed(id: u64) -> locks::Result<u64> {
    let __zklock_key = locks::__private::format!("user_{}", id);
    let __zklock_manager = locks::__private::global().await?;
    locks::__private::run(
            &__zklock_manager,
            &__zklock_key,
            locks::__private::Options::new(),
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
                    let __zklock_fake_return: locks::Result<u64> = loop {};
                    return __zklock_fake_return;
                }
                Ok(id)
            },
        )
        .await
}
fn main() {
    let _ = (Catalog::item, nightly, renamed);
}
