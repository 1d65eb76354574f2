//! The Redis keys and channel of one lock path.
//!
//! Every name is `zklock:<kind>:<path>`: a fixed prefix, a kind from a set where no kind is a
//! prefix of another, and the whole lock path (already an injective encoding of the user's
//! key under the namespace). So two different paths never share a key, and no two kinds of
//! key of any paths share a name.
//!
//! | name | type | what |
//! | --- | --- | --- |
//! | `zklock:lock:<path>` | string, `PX` lease | the exclusive holder (mutex, writer): its holder id |
//! | `zklock:shared:<path>` | sorted set | shared holders (readers, semaphore leases): holder id -> lease end (server ms) |
//! | `zklock:intent:<path>` | string, `PX` lease | a writer waits: new readers queue behind it |
//! | `zklock:fence:<path>` | integer, no expiry | the fencing counter, `INCR`ed per grant; kept for ever |
//! | `zklock:wake:<path>` | pub/sub channel | readers, writers, leases: a release publishes here; waiters listen |
//! | `zklock:queue:<path>` | sorted set | a mutex's waiting processes: queue member -> enqueue time (server µs) |
//! | `zklock:alive:<path>` | sorted set | the same members -> end of their liveness (server ms) |
//! | `zklock:notify:<hub id>` | pub/sub channel | one process's wake-ups: a mutex release tells the first waiter here; the first waiter to queue tells the holder |
//!
//! A queue member is `<hub id> <holder id>`: the hub id (a uuid per backend instance) names the
//! channel that wakes that process. A holder id carries its process's hub id too (` hub=<hub
//! id>`), so that a waiter can tell the holder it wants the lock.
//!
//! Each kind has one Redis type whatever the recipe, so recipes that share a raw path never
//! meet a `WRONGTYPE` error.

/// The prefix of every key and channel of the Redis backend.
pub(crate) const PREFIX: &str = "zklock:";
/// The prefix of a process's own wake-up channel, `zklock:notify:<hub id>`.
pub(crate) const NOTIFY_PREFIX: &str = "zklock:notify:";

/// The names of one lock path's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    pub(crate) exclusive: String,
    pub(crate) shared: String,
    pub(crate) intent: String,
    pub(crate) fence: String,
    pub(crate) channel: String,
    /// A mutex's waiting processes, in order.
    pub(crate) queue: String,
    /// The liveness of the queue's members.
    pub(crate) alive: String,
    /// A job's `at_least` window: no run may start before this server time (ms).
    pub(crate) run: String,
}

impl Keys {
    pub(crate) fn new(path: &str) -> Keys {
        let name = |kind: &str| format!("{PREFIX}{kind}:{path}");
        Keys {
            exclusive: name("lock"),
            shared: name("shared"),
            intent: name("intent"),
            fence: name("fence"),
            channel: name("wake"),
            queue: name("queue"),
            alive: name("alive"),
            run: name("run"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let k = Keys::new("/zklock/locks/sku_1");
        assert_eq!(k.exclusive, "zklock:lock:/zklock/locks/sku_1");
        assert_eq!(k.shared, "zklock:shared:/zklock/locks/sku_1");
        assert_eq!(k.fence, "zklock:fence:/zklock/locks/sku_1");
        assert_eq!(k.channel, "zklock:wake:/zklock/locks/sku_1");
    }

    #[test]
    fn injective_across_paths_and_kinds() {
        let paths = [
            "/a",
            "/a:fence",
            "/lock:/a",
            "/a/b",
            "/a%2Fb",
            "/zklock/locks/%RW/a",
            "/zklock/locks/%SEM/a",
        ];
        let mut seen = std::collections::HashSet::new();
        for p in paths {
            let k = Keys::new(p);
            for name in [
                k.exclusive,
                k.shared,
                k.intent,
                k.fence,
                k.channel,
                k.queue,
                k.alive,
            ] {
                assert!(seen.insert(name.clone()), "{name} twice");
            }
        }
    }
}
