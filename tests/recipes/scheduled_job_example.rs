//! The scheduled-job example (`examples/scheduled_job.rs`), run briefly: three instance
//! processes on a real ZooKeeper fire the job every second for 6 s; the job runs more than once,
//! the others skip, and by the server's clock it never starts within its `at_least` (3 s) of
//! the run before.
//!
//! Not a libtest harness (`harness = false` in Cargo.toml): the example starts its instances by
//! running its own executable again, which here is this test.

#[allow(dead_code)]
#[path = "../../examples/scheduled_job.rs"]
mod example;

use std::time::Duration;

fn main() {
    // In an instance process, `run` fires the job and exits.
    let report = example::run(Duration::from_secs(6));
    if let Err(violation) = report.check() {
        panic!("{violation}");
    }
    assert!(
        report.runs.len() >= 2,
        "6 s with a 3 s window: the job runs at least twice: {report:?}"
    );
    assert!(
        !report.skips.is_empty(),
        "three instances every second: some skip: {report:?}"
    );
    // Every instance fired on every tick: a run or a skip each time.
    assert!(
        report.runs.len() + report.skips.len() >= 3 * 5,
        "{report:?}"
    );
    println!("scheduled_job_example: ok");
}
