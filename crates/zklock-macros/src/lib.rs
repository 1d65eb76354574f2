//! The `#[distributed_lock]` attribute (work in progress: see issue 4).
