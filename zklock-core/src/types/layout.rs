//! Where each recipe keeps the lock of a key: the one place the path layout is written.
//!
//! Under a namespace `ns`, the lock of an encoded key `k` is at:
//!
//! | recipe | path |
//! | --- | --- |
//! | mutex, scheduled job | `ns/k` |
//! | read/write lock | `ns/%RW/k` |
//! | semaphore | `ns/%SEM/k` |
//! | leader latch | `ns/%LATCH/k` |
//!
//! A job's run record sits beside its lock, at `<lock path>%RUN`. An encoded key escapes `%`
//! as `%25`, so no encoded key is `%RW`, `%SEM` or `%LATCH` or contains `%RUN`: no path of
//! one recipe is another recipe's, and no run record is a lock.

use crate::types::inspect::LockKind;
use crate::types::key::Key;

/// The recipes in the order [`inspect`](crate) looks for a key: the first with a holder or a
/// waiter is the one shown.
pub(crate) const KINDS: [LockKind; 4] = [
    LockKind::Mutex,
    LockKind::ReadWrite,
    LockKind::Semaphore,
    LockKind::Leader,
];

/// The folder (under the namespace) of `kind`'s locks, `None` for the mutex, whose locks sit
/// in the namespace itself.
fn folder(kind: LockKind) -> Option<&'static str> {
    match kind {
        LockKind::Mutex => None,
        LockKind::ReadWrite => Some("%RW"),
        LockKind::Semaphore => Some("%SEM"),
        LockKind::Leader => Some("%LATCH"),
    }
}

/// The directory holding `kind`'s locks under `namespace`.
pub(crate) fn dir(namespace: &str, kind: LockKind) -> String {
    match folder(kind) {
        None => namespace.to_string(),
        Some(f) => format!("{namespace}/{f}"),
    }
}

/// The lock path of `key` for `kind` under `namespace`.
pub(crate) fn path(namespace: &str, kind: LockKind, key: &Key) -> String {
    format!("{}/{}", dir(namespace, kind), key.encoded())
}

/// Where a job's last run is recorded: beside the job's lock path, never under it (a Curator
/// client locking the path would take a child for a contender).
#[cfg_attr(not(feature = "zookeeper"), allow(dead_code))]
pub(crate) fn run_record(lock_path: &str) -> String {
    format!("{lock_path}%RUN")
}

/// The recipe and the decoded key of a lock path under `namespace`; `None` for a path that is
/// not one of this layout's locks there (another folder, a run record, a raw path).
pub(crate) fn parse(namespace: &str, path: &str) -> Option<(LockKind, String)> {
    let rest = path.strip_prefix(namespace)?.strip_prefix('/')?;
    for kind in KINDS {
        let name = match folder(kind) {
            None => rest,
            Some(f) => match rest.strip_prefix(f).and_then(|r| r.strip_prefix('/')) {
                Some(name) => name,
                None => continue,
            },
        };
        if name.contains('/') {
            continue;
        }
        // Only a key's own encoding: a name that decodes but is not how its key encodes
        // (`b%61`) is some other client's node, not this layout's lock.
        let key =
            Key::decode(name).filter(|k| Key::new(k.as_str()).is_ok_and(|k| k.encoded() == name));
        if let Some(key) = key {
            return Some((kind, key));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_path_parses_back_to_its_recipe_and_key() {
        for key in ["a", "a/b", "%RW", "x%RUN", "sku 7"] {
            let k = Key::new(key).unwrap();
            for kind in KINDS {
                let p = path("/ns", kind, &k);
                assert_eq!(parse("/ns", &p), Some((kind, key.to_string())), "{p}");
                assert_eq!(parse("/ns", &run_record(&p)), None, "{p}%RUN");
            }
        }
        assert_eq!(parse("/ns", "/other/a"), None);
        assert_eq!(parse("/ns", "/ns/%RW"), None);
        assert_eq!(parse("/ns", "/ns/a/b"), None);
        assert_eq!(parse("/ns", "/ns/b%61"), None, "not how `ba` encodes");
    }
}
