//! `zklock status`: one lock in detail, every holder and waiter.

use zklock_core::{LockInfo, LockManager};

use crate::args::{target, Target, TargetArgs};
use crate::durations::age;

/// Prints the lock KEY (or `--path`): its path and kind, then who holds and waits, since when,
/// with which token, session and node.
pub(crate) async fn status(manager: &LockManager, args: &TargetArgs) -> zklock_core::Result<u8> {
    let info = inspect_target(manager, args).await?;
    println!(
        "key:  {}\npath: {}\nkind: {}",
        info.key, info.path, info.kind
    );
    if info.holders.is_empty() && info.waiters.is_empty() {
        println!("free: no holder, no waiter");
        return Ok(0);
    }
    for (role, list) in [("holder", &info.holders), ("waiter", &info.waiters)] {
        for c in list.iter() {
            println!(
                "{role:<7} {:<6} {:<36} age {:>6}  token {}  session 0x{:x}  node {}",
                c.mode,
                c.owner.to_string(),
                age(c),
                c.token,
                c.session,
                c.node
            );
        }
    }
    Ok(0)
}

/// The lock KEY (or `--path`) as the server has it now.
async fn inspect_target(manager: &LockManager, args: &TargetArgs) -> zklock_core::Result<LockInfo> {
    match target(&args.key, &args.path) {
        Target::Key(key) => manager.inspect(key).await,
        Target::Path(path) => manager.inspect_path(path).await,
    }
}
