// The expansion snapshot of more forms compiles as plain code.
include!("../../../../snapshots/forms.expanded.rs");
