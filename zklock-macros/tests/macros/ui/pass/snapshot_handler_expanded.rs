// The expansion snapshot itself compiles as plain code.
include!("../../../../snapshots/handler.expanded.rs");
