// The expansion snapshot of more forms compiles as plain code.
include!("../../../crates/zklock-macros/snapshots/forms.expanded.rs");
