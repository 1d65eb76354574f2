//! Compile-time checks: guards and acquire futures can cross threads; owned forms are 'static.

use zklock::{LockGuard, LockManager, Mutex, OwnedLockGuard};

fn send<T: Send>(_: &T) {}
fn send_static<T: Send + 'static>(_: &T) {}

#[allow(dead_code, clippy::let_underscore_future)]
fn bounds(m: LockManager, mutex: Mutex) {
    fn is_send<T: Send>() {}
    fn is_send_sync_static<T: Send + Sync + 'static>() {}
    is_send::<LockGuard<'static>>();
    is_send_sync_static::<OwnedLockGuard>();
    is_send_sync_static::<LockManager>();
    is_send_sync_static::<Mutex>();
    is_send_sync_static::<zklock::Error>();
    send(&m.lock("k"));
    send(&m.try_lock("k"));
    send(&m.with_lock("k", async {}));
    send(&mutex.lock());
    send_static(&mutex.clone().lock_owned());
    send_static(&mutex.clone().try_lock_owned());
}

#[test]
fn bounds_hold() {
    // The checks are in `bounds`, which only needs to compile.
    let _ = bounds as fn(LockManager, Mutex);
}
