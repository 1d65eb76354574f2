// The handler of the expansion snapshot, through the macro.
include!("../../../../snapshots/handler.rs");
