// The forms of the expansion snapshot, through the macro.
include!("../../../../zklock-macros/snapshots/forms.rs");
