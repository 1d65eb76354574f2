// The expansion snapshot of more forms compiles as plain code.
include!("../../../../zklock-macros/snapshots/forms.expanded.rs");
