//! The test kit's etcd against Debian's etcd 3.4: one server, a 3-member cluster's leader and
//! replication, failover on a killed or paused leader, and cleanup on drop.

use std::time::{Duration, Instant};

use zklock_testkit::{EtcdCluster, EtcdServer};

fn process_alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; its state is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

/// Every number under `"key":` in `etcdctl ... -w json` output (unquoted there).
fn numbers(json: &str, key: &str) -> Vec<u64> {
    json.match_indices(&format!("\"{key}\":"))
        .map(|(at, m)| {
            json[at + m.len()..]
                .chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap_or_else(|_| panic!("no number after {key} in {json}"))
        })
        .collect()
}

fn get(etcd: &EtcdCluster, i: usize, key: &str) -> String {
    etcd.member_etcdctl(i, &["get", key, "--print-value-only"])
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn a_server_serves_and_keeps_its_data_across_a_restart() {
    let started = Instant::now();
    let mut etcd = EtcdServer::start().unwrap();
    eprintln!("etcd: one server healthy in {:?}", started.elapsed());
    let port = etcd.port();
    assert_eq!(etcd.endpoint(), format!("127.0.0.1:{port}"));
    assert_eq!(etcd.url(), format!("etcd://127.0.0.1:{port}"));
    // Fails (exit status 1) when unhealthy.
    etcd.etcdctl(&["endpoint", "health"]).unwrap();
    etcd.etcdctl(&["put", "survives", "restart"]).unwrap();

    let pid = etcd.pid().unwrap();
    etcd.stop().unwrap();
    assert_eq!(etcd.pid(), None);
    assert!(!process_alive(pid));
    assert!(etcd.etcdctl(&["get", "survives"]).is_err());
    etcd.stop().unwrap(); // idempotent

    let restarted = Instant::now();
    etcd.restart().unwrap();
    eprintln!("etcd: one server restarted in {:?}", restarted.elapsed());
    assert_eq!(etcd.port(), port);
    assert_eq!(
        etcd.etcdctl(&["get", "survives", "--print-value-only"])
            .unwrap()
            .trim(),
        "restart"
    );

    // Paused, it accepts connections but answers nothing.
    etcd.pause().unwrap();
    assert!(etcd.is_paused());
    assert!(etcd.etcdctl(&["get", "survives"]).is_err());
    etcd.resume().unwrap();
    etcd.etcdctl(&["put", "after", "pause"]).unwrap();
}

#[test]
fn a_cluster_has_three_members_one_leader_and_replicates() {
    let started = Instant::now();
    let etcd = EtcdCluster::start(3).unwrap();
    eprintln!("etcd: 3-member cluster healthy in {:?}", started.elapsed());
    assert_eq!(etcd.len(), 3);
    assert_eq!(etcd.endpoints().len(), 3);
    assert_eq!(etcd.url(), format!("etcd://{}", etcd.endpoints().join(",")));

    let members = etcd.etcdctl(&["member", "list"]).unwrap();
    assert_eq!(members.lines().count(), 3, "{members}");
    assert_eq!(members.matches(", started, ").count(), 3, "{members}");

    // Every member names the same leader, which is one of them and the kit's. (etcdctl runs
    // against every live member: `endpoint status` reports each.)
    let status = etcd.etcdctl(&["endpoint", "status", "-w", "json"]).unwrap();
    let ids = numbers(&status, "member_id");
    let leaders = numbers(&status, "leader");
    assert_eq!(ids.len(), 3, "{status}");
    assert!(leaders.iter().all(|l| *l == leaders[0]), "{status}");
    let leading: Vec<usize> = (0..3).filter(|&i| ids[i] == leaders[0]).collect();
    assert_eq!(leading.len(), 1, "{status}");
    assert_eq!(etcd.leader(), Some(leading[0]));

    etcd.member_etcdctl(0, &["put", "written-on", "member 0"])
        .unwrap();
    assert_eq!(get(&etcd, 1, "written-on"), "member 0");
    assert_eq!(get(&etcd, 2, "written-on"), "member 0");
    // The server's own counter: the key's revision is the same everywhere.
    let revisions: Vec<Vec<u64>> = (0..3)
        .map(|i| {
            let json = etcd
                .member_etcdctl(i, &["get", "written-on", "-w", "json"])
                .unwrap();
            numbers(&json, "mod_revision")
        })
        .collect();
    assert!(revisions.iter().all(|r| r.len() == 1 && *r == revisions[0]));
}

#[test]
fn killing_the_leader_elects_another_and_writes_go_on() {
    let mut etcd = EtcdCluster::start(3).unwrap();
    etcd.etcdctl(&["put", "before", "1"]).unwrap();
    let old = etcd.leader().unwrap();
    etcd.kill(old).unwrap();
    assert_eq!(etcd.pid(old), None);

    let killed = Instant::now();
    let new = etcd.wait_for_leader(Duration::from_secs(20)).unwrap();
    eprintln!(
        "etcd: new leader {new} (old {old}) {:?} after the leader was killed (election timeout {:?})",
        killed.elapsed(),
        etcd.election_timeout()
    );
    assert_ne!(new, old);
    etcd.etcdctl(&["put", "after", "2"]).unwrap();
    let other = (0..3).find(|&i| i != old && i != new).unwrap();
    assert_eq!(get(&etcd, other, "after"), "2");
    assert_eq!(get(&etcd, new, "before"), "1");

    // The old leader comes back with its data, follows, and catches up. (Without pre-vote,
    // off in etcd 3.4, a member that campaigns as it comes back may make another leader: which
    // one leads is not the point.)
    let restarted = Instant::now();
    etcd.restart(old).unwrap();
    eprintln!("etcd: killed member restarted in {:?}", restarted.elapsed());
    etcd.wait_for_leader(Duration::from_secs(20)).unwrap();
    assert_eq!(get(&etcd, old, "after"), "2");
    assert_eq!(get(&etcd, old, "before"), "1");
}

#[test]
fn a_paused_leader_is_replaced_and_follows_when_resumed() {
    let etcd = EtcdCluster::start(3).unwrap();
    let old = etcd.leader().unwrap();
    etcd.pause(old).unwrap();
    assert!(etcd.is_paused(old));
    let paused = Instant::now();
    let new = etcd.wait_for_leader(Duration::from_secs(20)).unwrap();
    eprintln!(
        "etcd: new leader {:?} after the leader was paused",
        paused.elapsed()
    );
    assert_ne!(new, old);
    etcd.etcdctl(&["put", "while-paused", "yes"]).unwrap();

    etcd.resume(old).unwrap();
    // The old leader steps down, follows the new one and gets what it missed.
    let leader = etcd.wait_for_leader(Duration::from_secs(20)).unwrap();
    assert_ne!(leader, old);
    assert_eq!(get(&etcd, old, "while-paused"), "yes");
}

#[test]
fn drop_kills_the_members_even_when_paused_and_removes_their_files() {
    let etcd = EtcdCluster::start(3).unwrap();
    let pids: Vec<u32> = (0..3).map(|i| etcd.pid(i).unwrap()).collect();
    let dirs: Vec<std::path::PathBuf> = (0..3).map(|i| etcd.data_dir(i).to_path_buf()).collect();
    assert!(dirs.iter().all(|d| d.join("member").is_dir()));
    etcd.pause(1).unwrap();
    drop(etcd);
    assert!(pids.iter().all(|&pid| !process_alive(pid)));
    assert!(dirs.iter().all(|d| !d.exists()));
}

#[test]
fn a_cluster_of_zero_is_refused() {
    let err = EtcdCluster::start(0).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
}

#[test]
fn the_kit_types_cross_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<EtcdServer>();
    send_sync::<EtcdCluster>();
}
