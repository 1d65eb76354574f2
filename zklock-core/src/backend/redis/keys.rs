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
    /// The names of `path`'s keys. Built on every acquire: each name is one allocation of its
    /// exact size, with no formatting machinery.
    pub(crate) fn new(path: &str) -> Keys {
        let name = |kind: &str| {
            let mut name = String::with_capacity(PREFIX.len() + kind.len() + 1 + path.len());
            name.push_str(PREFIX);
            name.push_str(kind);
            name.push(':');
            name.push_str(path);
            name
        };
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

/// The [`Keys`] of the lock paths a backend acquired lately, so that an acquire of a path seen
/// before builds no name. Bounded: once it holds [`KeysCache::MAX`] paths it starts afresh.
#[derive(Default)]
pub(crate) struct KeysCache(
    std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Keys>>>,
);

impl KeysCache {
    /// The most paths kept.
    pub(crate) const MAX: usize = 1024;

    /// `path`'s keys.
    pub(crate) fn get(&self, path: &str) -> std::sync::Arc<Keys> {
        let mut paths = self.0.lock().expect("not poisoned");
        if let Some(keys) = paths.get(path) {
            return keys.clone();
        }
        if paths.len() >= Self::MAX {
            paths.clear();
        }
        let keys = std::sync::Arc::new(Keys::new(path));
        paths.insert(path.to_string(), keys.clone());
        keys
    }
}

/// Fresh holder ids for one backend: `<uuid> <tag>`, the uuid-shaped part unique for ever.
///
/// The first id's uuid is random; each next one adds one to it (in the bits a version-4 uuid
/// leaves random), so ids never repeat within the backend, and ids of two backends (in this
/// process, another one, or a later run) meet only if their random starts lie within the
/// number of ids drawn of each other: about 2^-122 × ids² for any pair. Drawing an id takes no
/// system call and no formatting machinery (a random uuid per id did both).
pub(crate) struct HolderIds {
    base: u128,
    drawn: std::sync::atomic::AtomicU64,
    /// ` host=<host> pid=<pid> hub=<hub id>[ id=<identity>]`, after the uuid.
    tag: String,
}

impl HolderIds {
    /// Ids ending in ` <tag>`.
    pub(crate) fn new(tag: String) -> HolderIds {
        HolderIds {
            base: uuid::Uuid::new_v4().as_u128(),
            drawn: std::sync::atomic::AtomicU64::new(0),
            tag,
        }
    }

    /// The next id.
    pub(crate) fn next(&self) -> String {
        let n = self
            .drawn
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let bytes = self.base.wrapping_add(u128::from(n)).to_be_bytes();
        let uuid = uuid::Builder::from_random_bytes(bytes).into_uuid();
        let mut buf = [0u8; uuid::fmt::Hyphenated::LENGTH];
        let mut id = String::with_capacity(buf.len() + 1 + self.tag.len());
        id.push_str(uuid.hyphenated().encode_lower(&mut buf));
        id.push(' ');
        id.push_str(&self.tag);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_gives_each_path_its_own_keys_and_stays_bounded() {
        let cache = KeysCache::default();
        let a = cache.get("/a");
        assert!(std::sync::Arc::ptr_eq(&a, &cache.get("/a")));
        assert_eq!(*cache.get("/b"), Keys::new("/b"));
        assert_eq!(*a, Keys::new("/a"));
        for i in 0..3 * KeysCache::MAX {
            assert_eq!(
                cache.get(&format!("/p{i}")).exclusive,
                format!("zklock:lock:/p{i}")
            );
        }
        assert!(cache.0.lock().unwrap().len() <= KeysCache::MAX);
    }

    #[test]
    fn holder_ids_are_distinct_uuids_with_the_tag() {
        let ids = HolderIds::new("host=h pid=1 hub=x".into());
        let other = HolderIds::new("host=h pid=1 hub=x".into());
        let mut seen = std::collections::HashSet::new();
        for _ in 0..1000 {
            for id in [ids.next(), other.next()] {
                let (uuid, tag) = id.split_once(' ').unwrap();
                assert_eq!(tag, "host=h pid=1 hub=x");
                let uuid = uuid::Uuid::parse_str(uuid).unwrap();
                assert_eq!(uuid.get_version_num(), 4, "{id}");
                assert!(seen.insert(uuid), "{id} twice");
            }
        }
    }

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
