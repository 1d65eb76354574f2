// The forms of the expansion snapshot, through the macro.
include!("../../../../snapshots/forms.rs");
