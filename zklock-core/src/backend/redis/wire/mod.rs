//! The protocol as the server sees it: the Lua scripts ([`scripts`]), the key layout and a
//! key's Cluster hash slot ([`keys`]), and a node's `host:port` as replies name it.
//!
//! A mutex (or a writer) is the key `zklock:lock:<path>`, taken with `SET key id NX PX lease`
//! in a Lua script that also advances the lock's fence counter (to the server's time in µs,
//! see [`scripts`]): the fencing token. Readers and semaphore leases are members of the
//! sorted set `zklock:shared:<path>`, scored by the end of their lease.

pub(super) mod keys;
pub(super) mod scripts;

use redis::RedisError;

/// `host:port` split, as a redirect names a node.
pub(crate) fn split_addr(addr: &str) -> redis::RedisResult<(String, u16)> {
    addr.rsplit_once(':')
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_string(), p.parse().ok()?)))
        .ok_or_else(|| {
            RedisError::from(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a Redis Cluster node's address {addr:?} is not host:port"),
            ))
        })
}
