//! Compile-time checks: guards and acquire futures can cross threads; guards are 'static.

use zklock::{LockGuard, LockManager, Mutex};

fn send<T: Send>(_: &T) {}

#[allow(dead_code, clippy::let_underscore_future)]
fn bounds(m: LockManager, mutex: Mutex) {
    fn is_send<T: Send>() {}
    fn is_send_sync_static<T: Send + Sync + 'static>() {}
    is_send_sync_static::<LockGuard>();
    is_send_sync_static::<LockManager>();
    is_send_sync_static::<Mutex>();
    is_send_sync_static::<zklock::Error>();
    send(&m.lock("k"));
    send(&m.try_lock("k"));
    send(&m.with_lock("k", async {}));
    send(&mutex.lock());
    send(&mutex.try_lock());
}

#[test]
fn bounds_hold() {
    // The checks are in `bounds`, which only needs to compile.
    let _ = bounds as fn(LockManager, Mutex);
}
