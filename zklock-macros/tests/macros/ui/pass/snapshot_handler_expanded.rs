// The expansion snapshot itself compiles as plain code.
include!("../../../../zklock-macros/snapshots/handler.expanded.rs");
