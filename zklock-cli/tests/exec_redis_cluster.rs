//! `zklock --connect redis+cluster://... exec` against the test kit's Redis Cluster: concurrent
//! execs exclude each other with increasing tokens, a holder shows in `ls` and `status` (every
//! primary scanned), and after a failover of its slot's primary a new holder's token is above
//! every earlier one.

mod common;

use common::*;
use zklock_testkit::RedisCluster;

fn url(cluster: &RedisCluster) -> String {
    format!("redis+cluster://{}", cluster.addrs().join(","))
}

#[test]
fn concurrent_execs_never_overlap_and_tokens_increase() {
    let cluster = RedisCluster::builder().replicas(0).start().unwrap();
    concurrent_exec_tokens(&url(&cluster));
    let (token, path) = exec_token_and_path(&url(&cluster), &[]);
    assert!(token > 1_600_000_000_000_000, "{token}");
    assert_eq!(path, "/zklock/locks/job%2F1");
}

#[test]
fn a_holder_is_listed_and_tokens_go_on_after_a_failover() {
    let cluster = RedisCluster::builder().replicas(1).start().unwrap();
    let url = url(&cluster);
    let dir = tempfile::tempdir().unwrap();
    let holder = spawn_holder(&url, &[], "listed", dir.path());
    let ls = zklock(&url).args(["ls"]).output().unwrap();
    assert_exit(&ls, 0);
    assert!(
        String::from_utf8_lossy(&ls.stdout).contains("listed"),
        "{ls:?}"
    );
    let status = zklock(&url).args(["status", "listed"]).output().unwrap();
    assert_exit(&status, 0);
    // SAFETY: kill(2) on a child we spawned and have not reaped; no memory effects.
    unsafe { libc::kill(holder.id() as libc::pid_t, libc::SIGTERM) };
    holder.wait_with_output().unwrap();

    let (before, _) = exec_token_and_path(&url, &[]);
    // Fail over every primary: whichever holds job/1's slot changes.
    for replica in cluster.replicas().unwrap() {
        cluster.failover(replica).unwrap();
    }
    let (after, _) = exec_token_and_path(&url, &[]);
    assert!(after > before, "{after} after {before}");
}
