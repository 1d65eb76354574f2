//! The `zklock` tool never prints a password: given in `--connect`, in `--sentinel-password` or
//! in the environment, on a connect that fails, for every backend.

mod common;

use common::zklock;

const SECRET: &str = "hunter2-s3cret";

#[test]
fn a_failing_connect_prints_no_password() {
    for (connect, extra) in [
        (format!("redis://locks:{SECRET}@127.0.0.1:1/"), vec![]),
        (
            "redis+sentinel://127.0.0.1:1/zklock".to_string(),
            vec!["--sentinel-password", SECRET],
        ),
        (format!("postgres://locks:{SECRET}@127.0.0.1:1/app"), vec![]),
        (format!("etcd://locks:{SECRET}@127.0.0.1:1"), vec![]),
    ] {
        for command in [vec!["ls"], vec!["exec", "k", "--", "true"]] {
            let mut run = zklock(&connect);
            run.args(&extra).args(&command);
            if connect.starts_with("redis+sentinel") {
                // The environment's password as well as the flag's.
                run.env("ZKLOCK_SENTINEL_PASSWORD", SECRET);
            }
            let out = run.output().expect("run zklock");
            assert_ne!(out.status.code(), Some(0), "nothing listens");
            let printed = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                printed.contains("zklock:") && !printed.contains("has no effect"),
                "it says the connect failed: {printed}"
            );
            assert!(
                !printed.contains(SECRET),
                "zklock {command:?} printed the password:\n{printed}"
            );
        }
    }
}
