//! The fault-injecting proxy against a real ZooKeeper, spoken to with just enough of the wire protocol:
//! forwarding, the lost reply to the Nth create, blackhole and heal, reset, delay, and four-letter words.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use zklock_testkit::{Proxy, ZkServer};

/// A raw ZooKeeper session: handshake done, requests numbered from 1.
struct Raw {
    stream: TcpStream,
    xid: i32,
}

const NODE_EXISTS: i32 = -110;

impl Raw {
    fn connect(addr: &str) -> io::Result<Raw> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        // ConnectRequest: protocolVersion, lastZxidSeen, timeOut, sessionId, passwd, readOnly.
        let mut b = Vec::new();
        b.extend(0i32.to_be_bytes());
        b.extend(0i64.to_be_bytes());
        b.extend(10_000i32.to_be_bytes());
        b.extend(0i64.to_be_bytes());
        b.extend(16i32.to_be_bytes());
        b.extend([0u8; 16]);
        b.push(0);
        write_frame(&mut stream, &b)?;
        read_frame(&mut stream)?;
        Ok(Raw { stream, xid: 0 })
    }

    /// Sends a persistent create of `path`; returns its xid.
    fn send_create(&mut self, path: &str) -> io::Result<i32> {
        self.xid += 1;
        let mut b = Vec::new();
        b.extend(self.xid.to_be_bytes());
        b.extend(1i32.to_be_bytes()); // create
        string(&mut b, path);
        b.extend(0i32.to_be_bytes()); // no data
        b.extend(1i32.to_be_bytes()); // one ACL: world:anyone, all
        b.extend(31i32.to_be_bytes());
        string(&mut b, "world");
        string(&mut b, "anyone");
        b.extend(0i32.to_be_bytes()); // persistent
        write_frame(&mut self.stream, &b)?;
        Ok(self.xid)
    }

    /// Reads one reply: (xid, error code).
    fn reply(&mut self) -> io::Result<(i32, i32)> {
        let r = read_frame(&mut self.stream)?;
        let xid = i32::from_be_bytes(r[0..4].try_into().unwrap());
        let err = i32::from_be_bytes(r[12..16].try_into().unwrap());
        Ok((xid, err))
    }

    fn create(&mut self, path: &str) -> io::Result<i32> {
        let xid = self.send_create(path)?;
        let (got, err) = self.reply()?;
        assert_eq!(got, xid);
        Ok(err)
    }
}

fn string(b: &mut Vec<u8>, s: &str) {
    b.extend((s.len() as i32).to_be_bytes());
    b.extend(s.as_bytes());
}

fn write_frame(s: &mut TcpStream, body: &[u8]) -> io::Result<()> {
    let mut f = (body.len() as i32).to_be_bytes().to_vec();
    f.extend_from_slice(body);
    s.write_all(&f)
}

fn read_frame(s: &mut TcpStream) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let mut body = vec![0u8; i32::from_be_bytes(len) as usize];
    s.read_exact(&mut body)?;
    Ok(body)
}

#[test]
fn proxy_forwards_and_injects_faults() {
    let server = ZkServer::start().unwrap();
    let proxy = Proxy::start(&server.connect_string()).unwrap();
    assert_eq!(proxy.upstream().port(), server.port());

    // Plain forwarding.
    let mut c = Raw::connect(&proxy.connect_string()).unwrap();
    assert_eq!(c.create("/through-proxy").unwrap(), 0);
    let stats = proxy.stats();
    assert_eq!((stats.connections, stats.creates), (1, 1));

    // The reply to the 2nd next create is lost, and the connection reset; the creates happened.
    proxy.drop_reply_to_nth_create(2);
    assert!(proxy.drop_pending());
    assert_eq!(c.create("/first").unwrap(), 0);
    c.send_create("/second").unwrap();
    assert!(c.reply().is_err(), "the reply must not arrive");
    assert!(!proxy.drop_pending());
    assert_eq!(proxy.stats().replies_dropped, 1);
    let mut direct = Raw::connect(&server.connect_string()).unwrap();
    assert_eq!(direct.create("/second").unwrap(), NODE_EXISTS);

    // Blackhole: nothing comes back until healed, then it does.
    let mut c = Raw::connect(&proxy.connect_string()).unwrap();
    c.stream
        .set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    proxy.blackhole();
    assert!(proxy.is_blackholed());
    let xid = c.send_create("/held-back").unwrap();
    assert!(c.reply().is_err(), "no reply through a blackhole");
    proxy.heal();
    c.stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    assert_eq!(c.reply().unwrap(), (xid, 0));
    // A connection opened during a blackhole reaches the server once it ends.
    proxy.blackhole();
    let late = std::thread::spawn({
        let addr = proxy.connect_string();
        move || Raw::connect(&addr).map(|mut r| r.create("/late"))
    });
    std::thread::sleep(Duration::from_millis(200));
    assert!(!late.is_finished(), "the handshake must wait for the heal");
    proxy.heal();
    assert_eq!(late.join().unwrap().unwrap().unwrap(), 0);

    // Reset: open connections die; new ones work.
    let resets = proxy.stats().resets;
    proxy.reset();
    assert!(c.create("/after-reset").is_err());
    assert!(proxy.stats().resets > resets);
    let mut c = Raw::connect(&proxy.connect_string()).unwrap();
    assert_eq!(c.create("/after-reset").unwrap(), 0);

    // Refuse: new connections are reset at once.
    proxy.refuse(true);
    assert!(Raw::connect(&proxy.connect_string()).is_err());
    proxy.refuse(false);

    // Delay: each way.
    proxy.set_delay(Duration::from_millis(150));
    let mut c = Raw::connect(&proxy.connect_string()).unwrap();
    let started = Instant::now();
    assert_eq!(c.create("/slow").unwrap(), 0);
    assert!(started.elapsed() >= Duration::from_millis(300));
    proxy.set_delay(Duration::ZERO);

    // Not ZooKeeper framing (a four-letter word): passed through as bytes.
    let mut s = TcpStream::connect(proxy.connect_string()).unwrap();
    s.write_all(b"ruok").unwrap();
    let mut answer = String::new();
    s.read_to_string(&mut answer).unwrap();
    assert_eq!(answer, "imok");

    // Dropping the proxy resets what goes through it.
    drop(proxy);
    assert!(c.create("/gone").is_err());
}
