// The expansion snapshot of jobs compiles as plain code.
include!("../../../../snapshots/jobs.expanded.rs");
