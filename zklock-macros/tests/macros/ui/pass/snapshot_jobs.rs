// The forms of the jobs expansion snapshot, through the macro.
include!("../../../../snapshots/jobs.rs");
