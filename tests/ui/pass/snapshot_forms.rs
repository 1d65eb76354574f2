// The forms of the expansion snapshot, through the macro.
include!("../../../crates/zklock-macros/snapshots/forms.rs");
