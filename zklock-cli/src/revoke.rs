//! `zklock revoke`: ask the holders of a lock to let go (Curator's revocation).

use zklock_core::LockManager;

use crate::args::{target, Target, TargetArgs};

/// Asks the holders of KEY (or `--path`) to let go; exits 1 when nobody holds it.
pub(crate) async fn revoke(manager: &LockManager, args: &TargetArgs) -> zklock_core::Result<u8> {
    let asked = match target(&args.key, &args.path) {
        Target::Key(key) => manager.revoke(key).await?,
        Target::Path(path) => manager.revoke_path(path).await?,
    };
    if asked.is_empty() {
        println!("nobody holds it: nothing to revoke");
        return Ok(1);
    }
    for node in asked {
        println!("asked the holder of {node} to let go (holders that opted in will release)");
    }
    Ok(0)
}
