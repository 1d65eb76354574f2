// The expansion snapshot itself compiles as plain code.
include!("../../../crates/zklock-macros/snapshots/handler.expanded.rs");
