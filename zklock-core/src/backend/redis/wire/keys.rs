//! The Redis keys and channel of one lock path, and a key's Redis Cluster hash slot
//! ([`slot`]).
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

/// How key names are laid out: as above on one server; on a Redis Cluster with a hash tag
/// after the kind, `zklock:<kind>:{<tag>}<path>`, the same for every key of a path, so that a
/// lock's keys share one slot and its scripts run on one node. The tag is the FNV-1a 64-bit
/// hash of the path in 16 lowercase hex digits: part of the wire format, never to change.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum Layout {
    /// One server (or Sentinel's primary).
    #[default]
    Plain,
    /// A Redis Cluster.
    Tagged,
}

impl Layout {
    /// The hash tag of `path`'s keys, with its braces.
    pub(crate) fn tag(path: &str) -> String {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in path.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        format!("{{{h:016x}}}")
    }

    /// The length of a tag (`{` 16 hex digits `}`).
    pub(crate) const TAG_LEN: usize = 18;

    /// The path a key name's part after `zklock:<kind>:` names.
    pub(crate) fn path_of(self, rest: &str) -> Option<&str> {
        match self {
            Layout::Plain => Some(rest),
            Layout::Tagged => rest
                .get(Layout::TAG_LEN..)
                .filter(|_| rest.starts_with('{') && rest.as_bytes()[Layout::TAG_LEN - 1] == b'}'),
        }
    }

    /// The `SCAN MATCH` pattern of a tag (already glob-safe).
    pub(crate) fn tag_pattern(self) -> &'static str {
        match self {
            Layout::Plain => "",
            Layout::Tagged => "{????????????????}",
        }
    }
}

/// The prefix of every key and channel of the Redis backend.
pub(crate) const PREFIX: &str = "zklock:";
/// The prefix of a process's own wake-up channel, `zklock:notify:<hub id>`.
pub(crate) const NOTIFY_PREFIX: &str = "zklock:notify:";

/// The names of one lock path's keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Keys {
    /// The lock path the keys are named after (what the process's undos are counted by).
    pub(crate) path: std::sync::Arc<str>,
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
    /// On Redis Cluster (tagged keys), the hash slot every key of the lock is in.
    pub(crate) slot: Option<u16>,
}

impl Keys {
    /// The names of `path`'s keys. Built on every acquire: each name is one allocation of its
    /// exact size, with no formatting machinery.
    pub(crate) fn new(path: &str) -> Keys {
        Keys::laid_out(path, Layout::Plain)
    }

    /// The names of `path`'s keys in `layout`.
    pub(crate) fn laid_out(path: &str, layout: Layout) -> Keys {
        let tag = match layout {
            Layout::Plain => String::new(),
            Layout::Tagged => Layout::tag(path),
        };
        let name = |kind: &str| {
            let mut name =
                String::with_capacity(PREFIX.len() + kind.len() + 1 + tag.len() + path.len());
            name.push_str(PREFIX);
            name.push_str(kind);
            name.push(':');
            name.push_str(&tag);
            name.push_str(path);
            name
        };
        Keys {
            path: path.into(),
            exclusive: name("lock"),
            shared: name("shared"),
            intent: name("intent"),
            fence: name("fence"),
            channel: name("wake"),
            queue: name("queue"),
            alive: name("alive"),
            run: name("run"),
            slot: (!tag.is_empty()).then(|| slot(&tag)),
        }
    }
}

/// The [`Keys`] of the lock paths a backend acquired lately, so that an acquire of a path seen
/// before builds no name. Bounded: once it holds [`KeysCache::MAX`] paths it starts afresh.
#[derive(Default)]
pub(crate) struct KeysCache(
    std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Keys>>>,
    Layout,
);

impl KeysCache {
    /// The most paths kept.
    pub(crate) const MAX: usize = 1024;

    /// A cache of keys in `layout`.
    pub(crate) fn new(layout: Layout) -> KeysCache {
        KeysCache(std::sync::Mutex::default(), layout)
    }

    /// The layout of the names.
    pub(crate) fn layout(&self) -> Layout {
        self.1
    }

    /// `path`'s keys.
    pub(crate) fn get(&self, path: &str) -> std::sync::Arc<Keys> {
        let mut paths = self.0.lock().expect("not poisoned");
        if let Some(keys) = paths.get(path) {
            return keys.clone();
        }
        if paths.len() >= Self::MAX {
            paths.clear();
        }
        let keys = std::sync::Arc::new(Keys::laid_out(path, self.1));
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

/// The number of hash slots of a Redis Cluster.
pub(crate) const SLOTS: usize = 16384;

/// A key's hash slot, as Redis Cluster computes it: CRC16 (XMODEM) of the key, or of its hash
/// tag (the text between the first `{` and the next `}`, when not empty), modulo 16384.
pub(crate) fn slot(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(bytes);
    crc16(hashed) % SLOTS as u16
}

/// CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0, as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_redis_clusters() {
        // Values from the Redis Cluster specification and `CLUSTER KEYSLOT`.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot("bar"), 5061);
        assert_eq!(slot("{user1000}.following"), slot("{user1000}.followers"));
        assert_eq!(slot("{user1000}.following"), slot("user1000"));
        // An empty tag hashes the whole key.
        assert_eq!(slot("foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(slot("foo{{bar}}zap"), slot("{bar"));
    }

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
    fn tagged_names_share_one_slot_and_name_their_path() {
        let k = Keys::laid_out("/zklock/locks/sku_1", Layout::Tagged);
        let tag = Layout::tag("/zklock/locks/sku_1");
        assert_eq!(tag.len(), Layout::TAG_LEN);
        assert_eq!(k.exclusive, format!("zklock:lock:{tag}/zklock/locks/sku_1"));
        let slot = slot(&k.exclusive);
        for name in [&k.shared, &k.intent, &k.fence, &k.queue, &k.alive, &k.run] {
            assert_eq!(super::slot(name), slot, "{name}");
        }
        let rest = k.exclusive.strip_prefix("zklock:lock:").unwrap();
        assert_eq!(Layout::Tagged.path_of(rest), Some("/zklock/locks/sku_1"));
        assert_eq!(Layout::Tagged.path_of("/untagged"), None);
        // A path with braces of its own keeps its keys in one slot.
        let k = Keys::laid_out("/a}b{c}", Layout::Tagged);
        assert_eq!(super::slot(&k.exclusive), super::slot(&k.fence));
        // FNV-1a 64: the tag never changes across versions (the guide shows this one).
        assert_eq!(Layout::tag(""), "{cbf29ce484222325}");
        assert_eq!(Layout::tag("/zklock/locks/sku_7"), "{8df2810047fa336d}");
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
