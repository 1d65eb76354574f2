//! The recipes beyond the mutex: read/write locks, semaphores, leaders, multi-locks, jobs; guards'
//! bounds. The global manager (`tests/recipes/global_manager.rs`, global to the process) and the
//! scheduled-job example (`tests/recipes/scheduled_job_example.rs`, its own `main`) are binaries of
//! their own.
//!
//! One test binary, `cargo test --test recipes`: each file of `tests/recipes/` is a module of it,
//! so its tests are named `<file>::<test>` (`cargo test --test recipes -- guard_bounds::`). The
//! helpers of `tests/common/` are included once, here, and the files use them through `crate::`.

#[path = "../common/mod.rs"]
mod common;
#[path = "../common/faults.rs"]
mod faults;

mod guard_bounds;
mod leader_latch;
mod multi_lock;
mod rwlock;
mod safety_semaphore_many;
mod scheduled_jobs;
mod semaphore;
