//! The test kit against real ZooKeeper: standalone servers, parallel servers, an ensemble's failover,
//! pause and resume, cleanup on drop, and the Curator peer.

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::thread;
use std::time::{Duration, Instant};

use zklock_testkit::{now_epoch_ms, peers_dir, CuratorHold, ZkCluster, ZkServer};

/// `zk_znode_count` from `mntr`.
fn znode_count(mntr: &str) -> u64 {
    mntr.lines()
        .find_map(|l| l.strip_prefix("zk_znode_count"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no zk_znode_count in {mntr:?}"))
}

fn process_alive(pid: u32) -> bool {
    // A zombie still has a /proc entry; its state is Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| {
            let state = stat.rsplit(')').next().unwrap_or("").trim_start();
            !state.starts_with('Z')
        })
        .unwrap_or(false)
}

/// Just enough of ZooKeeper's wire protocol to create one persistent znode (no client dependency).
fn create_znode(connect: &str, path: &str) -> io::Result<()> {
    fn frame(s: &mut TcpStream, body: &[u8]) -> io::Result<Vec<u8>> {
        s.write_all(&(body.len() as i32).to_be_bytes())?;
        s.write_all(body)?;
        let mut len = [0u8; 4];
        s.read_exact(&mut len)?;
        let mut reply = vec![0u8; i32::from_be_bytes(len) as usize];
        s.read_exact(&mut reply)?;
        Ok(reply)
    }
    fn string(b: &mut Vec<u8>, s: &str) {
        b.extend((s.len() as i32).to_be_bytes());
        b.extend(s.as_bytes());
    }
    let mut s = TcpStream::connect(connect)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    // ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd, readOnly.
    let mut b = Vec::new();
    b.extend(0i32.to_be_bytes());
    b.extend(0i64.to_be_bytes());
    b.extend(10_000i32.to_be_bytes());
    b.extend(0i64.to_be_bytes());
    b.extend(16i32.to_be_bytes());
    b.extend([0u8; 16]);
    b.push(0);
    frame(&mut s, &b)?;
    // RequestHeader(xid 1, create) + CreateRequest(path, empty data, world:anyone ALL, persistent).
    let mut b = Vec::new();
    b.extend(1i32.to_be_bytes());
    b.extend(1i32.to_be_bytes());
    string(&mut b, path);
    b.extend(0i32.to_be_bytes());
    b.extend(1i32.to_be_bytes());
    b.extend(31i32.to_be_bytes());
    string(&mut b, "world");
    string(&mut b, "anyone");
    b.extend(0i32.to_be_bytes());
    let reply = frame(&mut s, &b)?;
    let err = i32::from_be_bytes(reply[12..16].try_into().unwrap());
    if err != 0 {
        return Err(io::Error::other(format!("create {path}: error {err}")));
    }
    // closeSession
    let mut b = Vec::new();
    b.extend(2i32.to_be_bytes());
    b.extend((-11i32).to_be_bytes());
    frame(&mut s, &b)?;
    Ok(())
}

#[test]
fn standalone_serves_and_keeps_its_data_across_restart() {
    let mut server = ZkServer::start().unwrap();
    let port = server.port();
    assert_eq!(server.connect_string(), format!("127.0.0.1:{port}"));
    assert_eq!(server.four_letter("ruok").unwrap(), "imok");
    assert!(server
        .four_letter("srvr")
        .unwrap()
        .contains("Mode: standalone"));

    let before = znode_count(&server.four_letter("mntr").unwrap());
    create_znode(&server.connect_string(), "/testkit-survives-restart").unwrap();
    assert_eq!(
        znode_count(&server.four_letter("mntr").unwrap()),
        before + 1
    );

    let pid = server.pid().unwrap();
    server.stop().unwrap();
    assert_eq!(server.pid(), None);
    assert!(!process_alive(pid));
    assert!(server.four_letter("ruok").is_err());
    assert!(server.data_dir().join("version-2").is_dir());
    server.stop().unwrap(); // idempotent

    server.restart().unwrap();
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), Some(pid));
    assert_eq!(server.four_letter("ruok").unwrap(), "imok");
    assert_eq!(
        znode_count(&server.four_letter("mntr").unwrap()),
        before + 1
    );
    assert!(server.four_letter("dump").is_ok_and(|d| !d.is_empty()));
}

#[test]
fn builder_options_reach_the_server() {
    let server = ZkServer::builder()
        .tick_time(100)
        .max_session_timeout(5_000)
        .config("globalOutstandingLimit", "321")
        .start()
        .unwrap();
    let conf = server.four_letter("conf").unwrap();
    assert!(conf.contains("tickTime=100"), "{conf}");
    assert!(conf.contains("minSessionTimeout=200"), "{conf}");
    assert!(conf.contains("maxSessionTimeout=5000"), "{conf}");
    assert!(server.four_letter("ruok\n").is_err());
}

#[test]
fn a_server_that_cannot_start_says_why() {
    let started = Instant::now();
    let err = ZkServer::builder()
        .config("tickTime", "not-a-number")
        .start()
        .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("exited during startup"), "{msg}");
    assert!(
        msg.contains("not-a-number"),
        "the log's tail is quoted: {msg}"
    );
    assert!(started.elapsed() < Duration::from_secs(30));
}

#[test]
fn restart_waits_for_its_port_to_come_free() {
    let mut server = ZkServer::start().unwrap();
    server.stop().unwrap();
    // Someone holds the port until the server has failed to bind it once: restart retries.
    let squatter = TcpListener::bind(("127.0.0.1", server.port())).unwrap();
    let log_path = server.log_path().to_path_buf();
    let release = thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let log = std::fs::read_to_string(&log_path).unwrap_or_default();
            if log.contains("Address already in use") {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        drop(squatter);
    });
    server.restart().unwrap();
    release.join().unwrap();
    assert_eq!(server.four_letter("ruok").unwrap(), "imok");
    let log = std::fs::read_to_string(server.log_path()).unwrap();
    assert!(log.contains("Address already in use"), "{log}");
}

#[test]
fn servers_started_in_parallel_get_their_own_ports() {
    let servers: Vec<ZkServer> = (0..3)
        .map(|_| thread::spawn(ZkServer::start))
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap().unwrap())
        .collect();
    let mut ports: Vec<u16> = servers.iter().map(ZkServer::port).collect();
    ports.sort_unstable();
    ports.dedup();
    assert_eq!(ports.len(), 3);
    for s in &servers {
        assert_eq!(s.four_letter("ruok").unwrap(), "imok");
        assert_ne!(s.data_dir(), servers[0].data_dir().parent().unwrap());
    }
}

#[test]
fn paused_server_does_not_answer_until_resumed() {
    let server = ZkServer::start().unwrap();
    server.pause().unwrap();
    assert!(server.is_paused());
    assert!(server
        .four_letter_timeout("ruok", Duration::from_millis(300))
        .is_err());
    server.resume().unwrap();
    assert!(!server.is_paused());
    assert_eq!(server.four_letter("ruok").unwrap(), "imok");
}

#[test]
fn drop_kills_the_server_even_when_paused_and_removes_its_files() {
    let server = ZkServer::start().unwrap();
    let pid = server.pid().unwrap();
    let root = server.data_dir().parent().unwrap().to_path_buf();
    server.pause().unwrap();
    drop(server);
    assert!(!process_alive(pid));
    assert!(!root.exists());
}

#[test]
fn cluster_elects_a_new_leader_and_survives_pauses() {
    let started = Instant::now();
    let mut cluster = ZkCluster::start(3).unwrap();
    eprintln!("3-member cluster up in {:?}", started.elapsed());
    assert_eq!(cluster.len(), 3);
    let connect = cluster.connect_string();
    assert_eq!(connect.split(',').count(), 3);
    for i in 0..3 {
        assert!(connect.contains(&cluster.member_connect_string(i)));
        assert_eq!(cluster.member_four_letter(i, "ruok").unwrap(), "imok");
    }
    let modes: Vec<String> = (0..3).map(|i| cluster.member_mode(i).unwrap()).collect();
    assert_eq!(
        modes.iter().filter(|m| *m == "leader").count(),
        1,
        "{modes:?}"
    );
    assert_eq!(
        modes.iter().filter(|m| *m == "follower").count(),
        2,
        "{modes:?}"
    );

    // Lose the leader: the other two elect one of themselves.
    let old = cluster.leader().unwrap();
    let t = Instant::now();
    cluster.stop_member(old).unwrap();
    assert_eq!(cluster.member_pid(old), None);
    cluster.wait_for_quorum(Duration::from_secs(30)).unwrap();
    let new = cluster.leader().unwrap();
    assert_ne!(new, old);
    eprintln!("new leader after {:?}", t.elapsed());

    // The old leader comes back as a follower.
    cluster.restart_member(old).unwrap();
    cluster.wait_for_quorum(Duration::from_secs(30)).unwrap();
    assert_eq!(cluster.member_mode(old).as_deref(), Some("follower"));

    // Pause a follower: the rest keep a quorum; resumed, it serves again.
    let follower = (0..3).find(|&i| i != new).unwrap();
    cluster.pause_member(follower).unwrap();
    assert_eq!(cluster.member_mode(follower), None);
    cluster.wait_for_quorum(Duration::from_secs(10)).unwrap();
    cluster.resume_member(follower).unwrap();
    cluster.wait_for_quorum(Duration::from_secs(30)).unwrap();
    assert!(cluster.member_mode(follower).is_some());

    // Pause the leader: the others elect a new one; resumed, the old one rejoins.
    let leader = cluster.leader().unwrap();
    let t = Instant::now();
    cluster.pause_member(leader).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !matches!(cluster.leader(), Some(l) if l != leader) {
        assert!(Instant::now() < deadline, "no new leader while paused");
        thread::sleep(Duration::from_millis(50));
    }
    eprintln!("new leader while old one paused after {:?}", t.elapsed());
    cluster.wait_for_quorum(Duration::from_secs(10)).unwrap();
    cluster.resume_member(leader).unwrap();
    cluster.wait_for_quorum(Duration::from_secs(30)).unwrap();

    assert!(cluster.stop_member(7).is_err());
    let pids: Vec<u32> = (0..3).filter_map(|i| cluster.member_pid(i)).collect();
    assert_eq!(pids.len(), 3);
    drop(cluster);
    assert!(pids.iter().all(|&p| !process_alive(p)));
}

#[test]
fn cluster_without_quorum_is_reported() {
    let mut cluster = ZkCluster::start(3).unwrap();
    let leader = cluster.leader().unwrap();
    let other = (0..3).find(|&i| i != leader).unwrap();
    cluster.stop_member(leader).unwrap();
    cluster.stop_member(other).unwrap();
    let err = cluster
        .wait_for_quorum(Duration::from_millis(500))
        .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::TimedOut);
    assert!(err.to_string().contains("stopped"), "{err}");
    // Bringing one back restores the quorum.
    cluster.restart_member(other).unwrap();
    cluster.wait_for_quorum(Duration::from_secs(30)).unwrap();
}

#[test]
fn the_peers_are_in_the_repository() {
    let dir = peers_dir();
    assert!(
        dir.starts_with(env!("CARGO_MANIFEST_DIR")),
        "{}",
        dir.display()
    );
    for file in [
        "run",
        "CuratorHold.java",
        "CuratorBench.java",
        "kazoo_bench.py",
    ] {
        assert!(Path::new(&dir).join(file).is_file(), "{file} is missing");
    }
}

#[test]
fn curator_leader_selectors_take_turns() {
    let server = ZkServer::start().unwrap();
    let path = "/testkit/selector";
    let spawn = |id: &str| {
        CuratorHold::spawn(
            &server.connect_string(),
            path,
            &format!("selector:{id}"),
            300,
            1,
        )
        .unwrap()
    };
    let (mut first, mut second) = (spawn("one"), spawn("two"));
    let mut holds = Vec::new();
    for peer in [&mut first, &mut second] {
        let (event, acquired) = peer.next_event(Duration::from_secs(300)).unwrap();
        assert_eq!(event, "acquired");
        let (event, released) = peer.next_event(Duration::from_secs(30)).unwrap();
        assert_eq!(event, "released");
        assert!(released >= acquired + 300);
        holds.push((acquired, released));
    }
    holds.sort();
    assert!(
        holds[1].0 >= holds[0].1,
        "two LeaderSelectors led at once: {holds:?}"
    );
    assert!(first.wait().unwrap().success());
    assert!(second.wait().unwrap().success());
}

#[test]
fn curator_peer_reports_its_hold() {
    let server = ZkServer::start().unwrap();
    let start = now_epoch_ms();
    let mut peer = CuratorHold::spawn(
        &server.connect_string(),
        "/testkit/curator",
        "mutex",
        300,
        2,
    )
    .unwrap();
    let mut events = Vec::new();
    for _ in 0..4 {
        events.push(peer.next_event(Duration::from_secs(300)).unwrap());
    }
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names, ["acquired", "released", "acquired", "released"]);
    assert!(events[0].1 >= start);
    assert!(events[1].1 >= events[0].1 + 300);
    assert!(events.windows(2).all(|w| w[0].1 <= w[1].1));
    assert!(peer.wait().unwrap().success());
}

#[test]
fn curator_peer_is_killed_on_drop() {
    let server = ZkServer::start().unwrap();
    let mut peer = CuratorHold::spawn(
        &server.connect_string(),
        "/testkit/curator-drop",
        "mutex",
        600_000,
        1,
    )
    .unwrap();
    let (event, _) = peer.next_event(Duration::from_secs(300)).unwrap();
    assert_eq!(event, "acquired");
    drop(peer);
    // Its connection goes with it: wait until the server lists no session (only our `cons` itself).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let cons = server.four_letter("cons").unwrap();
        let clients = cons.lines().filter(|l| l.contains("sid=")).count();
        if clients == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "peer still connected:\n{cons}");
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn single_member_cluster_is_its_own_leader() {
    let cluster = ZkCluster::start(1).unwrap();
    assert_eq!(cluster.leader(), Some(0));
    assert_eq!(cluster.connect_string(), cluster.member_connect_string(0));
    cluster.wait_for_quorum(Duration::from_secs(5)).unwrap();
}
