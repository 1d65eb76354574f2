//! The Redis fence on Redis Cluster (placeholder: the tests land with the next commit).
