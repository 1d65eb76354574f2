//! Faults of Redis under Sentinel (placeholder: the tests land with the next commit).
