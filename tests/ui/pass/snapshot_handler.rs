// The handler of the expansion snapshot, through the macro.
include!("../../../crates/zklock-macros/snapshots/handler.rs");
