// The handler of the expansion snapshot, through the macro.
include!("../../../../zklock-macros/snapshots/handler.rs");
