//! Faults of Redis Cluster (placeholder: the tests land with the next commit).
