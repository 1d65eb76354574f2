// The expansion snapshot of jobs compiles as plain code.
include!("../../../../zklock-macros/snapshots/jobs.expanded.rs");
