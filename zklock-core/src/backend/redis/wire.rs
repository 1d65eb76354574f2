//! The small pieces of Redis's wire the backend's modules share: the error of a request that
//! got no reply in time, and a node's `host:port` as replies name it.

use redis::RedisError;

/// The error of a request that got no reply in time.
pub(crate) fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "no reply from Redis in time",
    ))
}

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
