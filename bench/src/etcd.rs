//! The etcd rows (an `etcd://` connect string): zklock's etcd backend beside two peers on plain
//! `etcd_client::Client`s:
//!
//! - `floor`: one lease granted up front per client and kept alive. Uncontended (one worker), a
//!   bare put of the key on that lease and its delete: no exclusion, the least any lock on etcd
//!   writes per cycle (two writes through the Raft log, each fsynced). Where workers share a key
//!   (`contended`, `keys`, `inproc`) it must exclude: a compare-and-put (a transaction that puts
//!   the key on the lease when its create revision is 0), sent again at once while it fails, and
//!   the delete. The least a client can do to exclude: no queue, no watch, every refused attempt
//!   one more write through the log (`attempts_per_cycle` counts the puts or transactions sent).
//! - `lockservice`: etcd's own lock service, the `Lock` and `Unlock` RPCs (`v3lockpb.Lock`),
//!   which run `concurrency.Mutex` inside the server; one lease per worker (per task for
//!   `inproc`: tasks sharing a lease would share the lock, which is re-entrant per lease), each
//!   granted up front and kept alive.
//!
//! Workloads `uncontended`, `contended`, `keys` and `inproc` (one manager or client, `workers`
//! tasks). The lines carry `backend=etcd` and, per cycle, from the server's own metrics
//! (`/metrics` on its client port), read before and after the window: the gRPC messages it
//! received from clients (`requests_per_cycle`: every unary request and every message on a
//! stream, keep-alives and watch requests included; the lock service's own reads and writes
//! inside the server are not messages), the proposals it committed through Raft
//! (`writes_per_cycle`: every put, delete and transaction with a write, whoever sent it) and the
//! fsyncs of its write-ahead log (`fsyncs_per_cycle`: writes that arrive together share one).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, LockOptions, PutOptions, Txn, TxnOp};
use rand::{rngs::StdRng, Rng, SeedableRng};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use zklock_core::{LockManager, Mutex};

use crate::ops::local_queue_field;
use crate::window::{Gate, Overlap, Tally};
use crate::{BenchError, Options, Peer, Report, Result, Workload};

/// The lease of every hold: zklock's session lease and the peers' leases alike.
const LEASE: Duration = Duration::from_secs(10);

/// Whether `connect` names an etcd cluster.
pub(crate) fn is_etcd(connect: &str) -> bool {
    connect.starts_with("etcd://") || connect.starts_with("etcds://")
}

fn etcd(e: etcd_client::Error) -> BenchError {
    BenchError(format!("etcd: {e}"))
}

/// `etcd://host:port[,host:port...]` (or `etcds://`) -> `host:port` addresses.
fn endpoints(connect: &str) -> Result<Vec<String>> {
    let hosts = connect
        .strip_prefix("etcd://")
        .or_else(|| connect.strip_prefix("etcds://"))
        .ok_or_else(|| BenchError(format!("not an etcd:// URL: {connect}")))?
        .trim_end_matches('/');
    let hosts: Vec<String> = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(|h| {
            if h.contains(':') {
                h.to_string()
            } else {
                format!("{h}:2379")
            }
        })
        .collect();
    if hosts.is_empty() {
        return Err(BenchError(format!("no host in {connect}")));
    }
    Ok(hosts)
}

/// A plain client of the cluster.
async fn client(connect: &str) -> Result<Client> {
    let urls: Vec<String> = endpoints(connect)?
        .into_iter()
        .map(|h| format!("http://{h}"))
        .collect();
    Client::connect(urls, None).await.map_err(etcd)
}

/// A lease granted up front and kept alive every third of its TTL until dropped.
struct Lease {
    id: i64,
    keeper: tokio::task::JoinHandle<()>,
}

impl Lease {
    async fn grant(client: &Client) -> Result<Lease> {
        let mut client = client.clone();
        let id = client
            .lease_grant(LEASE.as_secs() as i64, None)
            .await
            .map_err(etcd)?
            .id();
        let (mut keeper, mut stream) = client.lease_keep_alive(id).await.map_err(etcd)?;
        let keeper = tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE / 3).await;
                if keeper.keep_alive().await.is_err() {
                    return;
                }
                match stream.message().await {
                    Ok(Some(_)) => {}
                    _ => return,
                }
            }
        });
        Ok(Lease { id, keeper })
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.keeper.abort();
    }
}

/// One manager (zklock) or client (the peers), with the names of the run's keys: the measured
/// ones, then the warm-up key.
enum Contender {
    Zklock {
        manager: LockManager,
        mutexes: Vec<Mutex>,
    },
    Floor {
        client: Client,
        lease: Lease,
        keys: Vec<String>,
        /// Compare-and-put (workers share a key) rather than a bare put.
        exclusive: bool,
        /// Transactions sent (one per acquire when uncontended).
        attempts: Arc<AtomicU64>,
    },
    LockService {
        client: Client,
        /// One per task of this client.
        leases: Vec<Lease>,
        names: Vec<String>,
    },
}

impl Contender {
    /// A manager or client with `tasks` tasks on it, for `keys` keys (plus the warm-up key).
    async fn open(
        options: &Options,
        root: &str,
        keys: usize,
        tasks: usize,
        attempts: &Arc<AtomicU64>,
    ) -> Result<Contender> {
        let names: Vec<String> = (0..=keys).map(|k| format!("{root}/k{k}")).collect();
        Ok(match options.peer {
            Peer::Zklock => {
                let tls = options.tls.clone();
                let manager = LockManager::builder(options.connect.clone())
                    .namespace(root)
                    .etcd(|e| {
                        let e = e.lease(LEASE);
                        match tls {
                            Some(tls) => e.tls(tls),
                            None => e,
                        }
                    })
                    .local_queue(options.local_queue)
                    .fencing_tokens(options.fencing_tokens)
                    .connect()
                    .await?;
                let mutexes = (0..=keys)
                    .map(|k| manager.mutex(&format!("k{k}")))
                    .collect::<zklock_core::Result<_>>()?;
                Contender::Zklock { manager, mutexes }
            }
            Peer::Floor => {
                let client = client(&options.connect).await?;
                let lease = Lease::grant(&client).await?;
                Contender::Floor {
                    client,
                    lease,
                    keys: names,
                    exclusive: options.workload != Workload::Uncontended || options.workers > 1,
                    attempts: attempts.clone(),
                }
            }
            Peer::LockService => {
                let client = client(&options.connect).await?;
                let leases =
                    futures::future::try_join_all((0..tasks).map(|_| Lease::grant(&client)))
                        .await?;
                Contender::LockService {
                    client,
                    leases,
                    names,
                }
            }
            other => {
                return Err(BenchError(format!(
                    "{other} does not run on etcd; on etcd: zklock, floor, lockservice"
                )))
            }
        })
    }

    /// One acquire of key `k` by task `slot` of this contender, the critical section of worker
    /// `who` (when timed: `overlap`), one release. How long the acquire took, and whether the
    /// key changed hands.
    async fn cycle(
        &self,
        k: usize,
        slot: usize,
        who: usize,
        overlap: Option<&Overlap>,
    ) -> Result<(Duration, bool)> {
        let t0 = Instant::now();
        let section = move || async move {
            match overlap {
                Some(overlap) => overlap.critical_section(k, who).await,
                None => false,
            }
        };
        let (waited, changed);
        match self {
            Contender::Zklock { mutexes, .. } => {
                let guard = mutexes[k].lock().await?;
                waited = t0.elapsed();
                changed = section().await;
                guard.release().await?;
            }
            Contender::Floor {
                client,
                lease,
                keys,
                exclusive,
                attempts,
            } => {
                let mut client = client.clone();
                let key = keys[k].as_str();
                let on_lease = || Some(PutOptions::new().with_lease(lease.id));
                if *exclusive {
                    loop {
                        attempts.fetch_add(1, Ordering::Relaxed);
                        let put = Txn::new()
                            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
                            .and_then([TxnOp::put(key, "", on_lease())]);
                        if client.txn(put).await.map_err(etcd)?.succeeded() {
                            break;
                        }
                        // Taken: ask again at once (the least a client can do; no queue).
                        tokio::task::yield_now().await;
                    }
                } else {
                    attempts.fetch_add(1, Ordering::Relaxed);
                    client.put(key, "", on_lease()).await.map_err(etcd)?;
                }
                waited = t0.elapsed();
                changed = section().await;
                let deleted = client.delete(key, None).await.map_err(etcd)?.deleted();
                if deleted != 1 {
                    return Err(BenchError(format!("the floor's key {key} was gone")));
                }
            }
            Contender::LockService {
                client,
                leases,
                names,
            } => {
                let mut client = client.clone();
                let lease = leases[slot % leases.len()].id;
                let held = client
                    .lock(
                        names[k].as_str(),
                        Some(LockOptions::new().with_lease(lease)),
                    )
                    .await
                    .map_err(etcd)?;
                waited = t0.elapsed();
                changed = section().await;
                client.unlock(held.key()).await.map_err(etcd)?;
            }
        }
        Ok((waited, changed))
    }

    async fn flush(&self) {
        if let Contender::Zklock { manager, .. } = self {
            manager.flush().await;
        }
    }

    /// Revokes the peers' leases (their keys go with them), best effort.
    async fn close(&self) {
        let (client, leases): (&Client, Vec<i64>) = match self {
            Contender::Zklock { .. } => return,
            Contender::Floor { client, lease, .. } => (client, vec![lease.id]),
            Contender::LockService { client, leases, .. } => {
                (client, leases.iter().map(|l| l.id).collect())
            }
        };
        let revokes = leases.into_iter().map(|id| {
            let mut client = client.clone();
            async move {
                let _ = tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(id)).await;
            }
        });
        futures::future::join_all(revokes).await;
    }
}

/// The server's counters, from `/metrics` on its client port: gRPC messages received from
/// clients, proposals committed, WAL fsyncs.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    messages: f64,
    writes: f64,
    fsyncs: f64,
}

impl Counters {
    async fn read(address: &str) -> Result<Counters> {
        let text = metrics(address).await?;
        let mut c = Counters::default();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let metric = name.split('{').next().unwrap_or(name);
            match metric {
                "grpc_server_msg_received_total" => c.messages += value,
                "etcd_server_proposals_committed_total" => c.writes += value,
                "etcd_disk_wal_fsync_duration_seconds_count" => c.fsyncs += value,
                _ => {}
            }
        }
        Ok(c)
    }

    fn since(self, before: Counters) -> Counters {
        Counters {
            messages: self.messages - before.messages,
            writes: self.writes - before.writes,
            fsyncs: self.fsyncs - before.fsyncs,
        }
    }
}

/// `GET /metrics` of the member at `address` (`host:port`), over plain HTTP/1.0.
async fn metrics(address: &str) -> Result<String> {
    let fail = |e: std::io::Error| BenchError(format!("etcd metrics at {address}: {e}"));
    let fetch = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream
            .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n").as_bytes())
            .await?;
        let mut body = String::new();
        stream.read_to_string(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    let text = tokio::time::timeout(Duration::from_secs(5), fetch)
        .await
        .map_err(|_| BenchError(format!("etcd metrics at {address}: no answer in 5 s")))?
        .map_err(fail)?;
    match text.split_once("\r\n\r\n") {
        Some((head, body)) if head.starts_with("HTTP/1.") && head.contains(" 200") => {
            Ok(body.to_string())
        }
        _ => Err(BenchError(format!(
            "etcd metrics at {address}: not an HTTP 200 answer"
        ))),
    }
}

pub(crate) async fn run(options: &Options) -> Result<Report> {
    let workload = options.workload;
    if !matches!(
        workload,
        Workload::Uncontended | Workload::Contended | Workload::Keys | Workload::Inproc
    ) {
        return Err(BenchError(format!(
            "{workload} does not run on etcd; on etcd: uncontended, contended, keys, inproc"
        )));
    }
    let keys = if workload == Workload::Keys {
        options.keys.max(1)
    } else {
        1
    };
    // One manager or client per worker; for inproc one for all, its tasks each a lease of
    // their own (the lock service).
    let (connections, tasks) = if workload == Workload::Inproc {
        (1, options.workers)
    } else {
        (options.workers, 1)
    };
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let root = format!("/bench/{}-{nanos}-{}", options.peer, std::process::id());
    let attempts = Arc::new(AtomicU64::new(0));
    let contenders: Vec<Arc<Contender>> = futures::future::try_join_all(
        (0..connections).map(|_| Contender::open(options, &root, keys, tasks, &attempts)),
    )
    .await?
    .into_iter()
    .map(Arc::new)
    .collect();

    // Warm-up on its own key, as CuratorBench does.
    for _ in 0..options.warmup {
        contenders[0].cycle(keys, 0, 0, None).await?;
    }
    for c in &contenders {
        c.flush().await;
    }

    let address = endpoints(&options.connect)?.remove(0);
    let overlap = Arc::new(Overlap::new(keys));
    let gate = Arc::new(Gate::new(options.workers));
    let mut workers = Vec::with_capacity(options.workers);
    for w in 0..options.workers {
        let contender = contenders[w % connections].clone();
        let slot = w / connections;
        let (overlap, gate) = (overlap.clone(), gate.clone());
        let cycles = options.cycles;
        workers.push(tokio::spawn(async move {
            let mut rng = StdRng::seed_from_u64(w as u64);
            // Untimed: each worker's first acquire, on its first key.
            let first = contender.cycle(w % keys, slot, w, None).await;
            gate.ready().await;
            first?;
            let mut tally = Tally::with_capacity(cycles);
            for _ in 0..cycles {
                let k = if keys > 1 { rng.gen_range(0..keys) } else { 0 };
                let t0 = Instant::now();
                let (waited, changed) = contender.cycle(k, slot, w, Some(&overlap)).await?;
                tally.record(t0, waited, changed);
            }
            Ok::<_, BenchError>(tally)
        }));
    }
    gate.all_ready().await;
    // The server's counters, from `/metrics` over plain HTTP: none over TLS.
    let before = match options.tls {
        None => Some(Counters::read(&address).await?),
        Some(_) => None,
    };
    let attempts_before = attempts.load(Ordering::SeqCst);
    let window = gate.open(options.server_pid);
    let tally = Tally::gather(workers).await?;
    let window = window.close();
    let elapsed = window.elapsed;
    for c in &contenders {
        c.flush().await;
    }
    let counted = match before {
        Some(before) => Some(Counters::read(&address).await?.since(before)),
        None => None,
    };
    let sent = attempts.load(Ordering::SeqCst) - attempts_before;
    for c in &contenders {
        c.close().await;
    }

    let mut latencies = tally.latencies;
    let n = latencies.len().max(1) as f64;
    let mut report = Report::new();
    report.push("peer", options.peer);
    report.push("workload", workload);
    report.push("workers", options.workers);
    report.push_ops(elapsed, &mut latencies);
    window.push_cpu(n as u64, &mut report);
    if options.workers > 1 {
        report.push_contention(elapsed, tally.changes, tally.max_wait_ns);
    }
    report.push("violations", overlap.violations.load(Ordering::SeqCst));
    if workload == Workload::Keys {
        report.push("keys", keys);
    }
    report.push("backend", "etcd");
    let per = |v: f64| format!("{:.2}", v / n);
    if let Some(counted) = counted {
        report.push("requests_per_cycle", per(counted.messages));
        report.push("writes_per_cycle", per(counted.writes));
        report.push("fsyncs_per_cycle", per(counted.fsyncs));
    }
    match options.peer {
        Peer::Zklock => {
            report.push("local_queue", local_queue_field(options));
            if !options.fencing_tokens {
                report.push("fencing_tokens", "off");
            }
        }
        Peer::Floor => report.push("attempts_per_cycle", per(sent as f64)),
        _ => {}
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_strings() {
        assert_eq!(
            endpoints("etcd://127.0.0.1:1,h").unwrap(),
            ["127.0.0.1:1", "h:2379"]
        );
        assert!(endpoints("etcd://").is_err());
        assert!(is_etcd("etcd://h:1") && !is_etcd("h:1"));
    }
}
