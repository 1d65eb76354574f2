// @generated from the file beside it by the snapshot test of zklock-macros (src/tests.rs): every #[distributed_lock] expanded.
use zklock::{Error, LockManager, Ran};
/// Every instance calls it; one runs it, and nobody again within 30 s of that run's start.
pub async fn digest(locks: &LockManager, day: u32) -> Result<Ran<usize>, Error> {
    let __zklock_key = ::zklock::__private::format!("digest_{}", day);
    let __zklock_manager = ::core::clone::Clone::clone(
        ::zklock::__private::AsLockManager::as_lock_manager(&(locks)),
    );
    ::zklock::__private::run_job(
            &__zklock_manager,
            &__zklock_key,
            ::zklock::__private::JobOptions {
                wait: ::core::option::Option::None,
                at_least: ::core::option::Option::Some(
                    ::core::time::Duration::from_secs(30),
                ),
                at_most: ::core::option::Option::Some(
                    ::core::time::Duration::from_secs(600),
                ),
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
                    let __zklock_fake_return: Result<usize, Error> = loop {};
                    return __zklock_fake_return;
                }
                Ok(day as usize)
            },
        )
        .await
}
/// Waits up to 2 s for the job, then skips with an error.
pub async fn invoices() -> zklock::Result<u32> {
    let __zklock_key = ::std::string::String::from("invoices");
    let __zklock_manager = ::zklock::__private::global().await?;
    ::zklock::__private::run_required_job(
            &__zklock_manager,
            &__zklock_key,
            ::zklock::__private::JobOptions {
                wait: ::core::option::Option::Some(::core::time::Duration::from_secs(2)),
                at_least: ::core::option::Option::None,
                at_most: ::core::option::Option::Some(
                    ::core::time::Duration::from_secs(90),
                ),
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
                    let __zklock_fake_return: zklock::Result<u32> = loop {};
                    return __zklock_fake_return;
                }
                Ok(7)
            },
        )
        .await
}
fn main() {
    let _ = (digest, invoices);
}
