// The forms of the jobs expansion snapshot, through the macro.
include!("../../../../zklock-macros/snapshots/jobs.rs");
