//! The load driver: starts instances of the service as separate processes, sends them many
//! concurrent orders for a few SKUs (demand well above stock), and measures what was sold;
//! once without locks and once with the lock on each lock service. The pause scenario, run on
//! each lock service, freezes a lock holder past its session timeout or lease to show whether
//! the next holder gets in, and the stale write refused by the fence. On Redis under Sentinel
//! (`--modes redis-sentinel`) the orders are paced over a few seconds and the primary is failed
//! over (`SENTINEL FAILOVER`) once a quarter of the stock has been ordered, while they flow.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};
use rand::Rng;
use tokio::sync::Notify;
use zklock_testkit::RedisSentinel;

pub use crate::backends::Mode;
use crate::backends::{LockBackend, LockService};
use crate::instances::{self, Instance, InstanceConfig};
pub use crate::report::DemoResults;
use crate::report::{FailoverReport, ModeReport, PauseReport};
use crate::scrape::LockMetrics;
use crate::service::{release_key, OrderRequest, OrderResponse, Outcome, HOLDING_EVENTS};
use crate::store::Store;

/// An error of the driver, as text for the user.
pub type DemoError = Box<dyn std::error::Error + Send + Sync>;

impl std::str::FromStr for Mode {
    type Err = String;

    /// `nolock`, or a lock backend's name (`zk`, `redis`, `postgres`).
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "nolock" | "no-lock" => Ok(Mode::NoLock),
            other => other
                .parse::<LockBackend>()
                .map(Mode::Lock)
                .map_err(|e| format!("{e}, or nolock")),
        }
    }
}

/// What the demo runs.
#[derive(Debug)]
pub struct DemoOptions {
    /// The executable with the `serve` subcommand (normally this one).
    pub exe: PathBuf,
    /// Redis URL.
    pub redis: String,
    /// The lock services, one per backend of the `Lock` modes.
    pub locks: Vec<LockService>,
    /// Instances (processes) of the service per mode.
    pub instances: u32,
    /// Concurrent clients.
    pub clients: u32,
    /// SKUs.
    pub skus: u32,
    /// Initial stock of each SKU.
    pub stock: i64,
    /// Orders placed, as a multiple of the total stock.
    pub demand: f64,
    /// Simulated work between read and write.
    pub work: Duration,
    /// Session timeout (ZooKeeper) and lease (Redis, PostgreSQL) of the instances' locks.
    pub session_timeout: Duration,
    /// The modes to run, in order.
    pub modes: Vec<Mode>,
    /// Run the pause scenario after each `Lock` mode.
    pub pause: bool,
    /// On Redis under Sentinel: how long the paced orders last, the failover in their middle.
    pub failover_span: Duration,
    /// Draw a progress bar (when stderr is a terminal).
    pub progress: bool,
    /// Where instance logs go.
    pub log_dir: PathBuf,
}

/// The SKU names: `100`, `101`, ...; the lock keys are then `sku_100`, ...
pub fn sku_names(count: u32) -> Vec<String> {
    (0..count).map(|i| (100 + i).to_string()).collect()
}

/// The SKU of the pause scenario (stock 1).
pub const PAUSE_SKU: &str = "900";

/// Runs the demo.
///
/// # Errors
/// When Redis, ZooKeeper or an instance cannot be reached or started.
pub async fn run(options: &DemoOptions) -> Result<DemoResults, DemoError> {
    let store = Store::connect(&options.redis).await?;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(options.clients as usize)
        .timeout(Duration::from_secs(120))
        .build()?;
    let mut results = DemoResults {
        modes: Vec::new(),
        pauses: Vec::new(),
    };
    for &mode in &options.modes {
        let lock = match mode.backend() {
            None => None,
            Some(backend) => Some(
                options
                    .locks
                    .iter()
                    .find(|l| l.backend == backend)
                    .ok_or_else(|| format!("no lock service for {backend}"))?
                    .connect
                    .clone(),
            ),
        };
        let config = InstanceConfig {
            exe: options.exe.clone(),
            redis: options.redis.clone(),
            lock,
            session_timeout: options.session_timeout,
            work: options.work,
            debug_hold: mode.backend().is_some() && options.pause,
            log_dir: options.log_dir.join(mode.log_dir()),
        };
        std::fs::create_dir_all(&config.log_dir)?;
        let skus = sku_names(options.skus);
        let stock: Vec<(String, i64)> = skus.iter().map(|s| (s.clone(), options.stock)).collect();
        store.reset(&stock).await?;
        println!(
            "{}: starting {} instances of the service{}",
            mode.title(),
            options.instances,
            match mode.backend() {
                Some(b) => format!(" (locking on {})", b.title()),
                None => " (--no-lock)".into(),
            }
        );
        let instances = instances::start_all(&config, options.instances).await?;
        let outcome = async {
            let report = load(options, mode, &http, &store, &instances, &skus).await?;
            let pause = match mode.backend() {
                Some(backend) if options.pause => {
                    Some(pause_scenario(options, backend, &http, &store, &instances).await?)
                }
                _ => None,
            };
            Ok::<_, DemoError>((report, pause))
        }
        .await;
        for i in instances {
            i.stop().await;
        }
        let (report, pause) = outcome?;
        results.modes.push(report);
        results.pauses.extend(pause);
    }
    Ok(results)
}

/// One order's answer as the client saw it.
struct Sample {
    outcome: Outcome,
    latency: Duration,
    /// When the answer came.
    answered: Instant,
}

/// The failover of a run on Redis under Sentinel, as it went.
struct FailoverRun {
    old_primary: String,
    new_primary: String,
    /// When `SENTINEL FAILOVER` was sent.
    sent: Instant,
    /// When every Sentinel named the new primary and it said so.
    done: Instant,
}

/// The failover in the middle of a run: `SENTINEL FAILOVER` once `trigger` is notified, and
/// the wait until the Sentinels name the new primary.
fn fail_over(
    sentinel: Arc<RedisSentinel>,
    trigger: Arc<Notify>,
) -> tokio::task::JoinHandle<Result<FailoverRun, DemoError>> {
    tokio::spawn(async move {
        trigger.notified().await;
        let sent = Instant::now();
        let ran = tokio::task::spawn_blocking(move || {
            let old = sentinel.primary_addr()?;
            let new = sentinel.failover()?;
            Ok::<_, std::io::Error>((old, sentinel.node_addr(new)))
        })
        .await;
        let done_at = Instant::now();
        let (old_primary, new_primary) = ran??;
        Ok(FailoverRun {
            old_primary,
            new_primary,
            sent,
            done: done_at,
        })
    })
}

/// Places `demand x stock` orders from `clients` concurrent clients, each order to a random
/// instance for a random SKU, and reads the store afterwards.
async fn load(
    options: &DemoOptions,
    mode: Mode,
    http: &reqwest::Client,
    store: &Store,
    instances: &[Instance],
    skus: &[String],
) -> Result<ModeReport, DemoError> {
    let initial = options.stock * skus.len() as i64;
    let orders = ((initial as f64) * options.demand).ceil() as u64;
    let bar = if options.progress {
        ProgressBar::new(orders)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template(
            "{prefix:>12} [{bar:40.cyan/blue}] {pos:>5}/{len} orders  {rate:>9}  {elapsed}",
        )?
        .with_key(
            "rate",
            |state: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                let _ = write!(w, "{:.0}/s", state.per_sec());
            },
        )
        .progress_chars("=> "),
    );
    bar.set_prefix(mode.title());
    let addrs: Arc<Vec<SocketAddr>> = Arc::new(instances.iter().map(|i| i.addr).collect());
    let skus = Arc::new(skus.to_vec());
    let next = Arc::new(AtomicU64::new(0));
    // On Redis under Sentinel: the orders are paced over `failover_span` so that they keep
    // flowing while the primary fails over, which is sent once a quarter of the stock has been
    // ordered (with demand above stock, sales then go on after the failover).
    let failover = match mode.backend() {
        Some(b) if b.fails_over() => {
            let sentinel = options
                .locks
                .iter()
                .find(|l| l.backend == b)
                .and_then(|l| l.sentinel())
                .ok_or("the failover needs the demo's own Sentinels (not ZKLOCK_CONNECT)")?;
            let trigger = Arc::new(Notify::new());
            let pace = options.failover_span.div_f64(orders.max(1) as f64);
            let at = (initial as u64 / 4).min(orders.saturating_sub(1));
            Some((fail_over(sentinel, trigger.clone()), trigger, pace, at))
        }
        _ => None,
    };
    let pacing = failover
        .as_ref()
        .map(|(_, trigger, pace, at)| (trigger.clone(), *pace, *at));
    let started = Instant::now();
    let mut clients = Vec::new();
    for _ in 0..options.clients {
        let (http, addrs, skus, next, bar, pacing) = (
            http.clone(),
            addrs.clone(),
            skus.clone(),
            next.clone(),
            bar.clone(),
            pacing.clone(),
        );
        clients.push(tokio::spawn(async move {
            let mut samples = Vec::new();
            loop {
                let n = next.fetch_add(1, Ordering::Relaxed);
                if n >= orders {
                    break;
                }
                if let Some((trigger, pace, at)) = &pacing {
                    // Order n goes out at n paces from the start (at once when behind).
                    tokio::time::sleep_until((started + pace.mul_f64(n as f64)).into()).await;
                    if n == *at {
                        trigger.notify_one();
                    }
                }
                let (addr, sku) = {
                    let mut rng = rand::thread_rng();
                    (
                        addrs[rng.gen_range(0..addrs.len())],
                        skus[rng.gen_range(0..skus.len())].clone(),
                    )
                };
                let t0 = Instant::now();
                let outcome = match order(&http, addr, &sku, &format!("o{n}"), false).await {
                    Ok(answer) => answer.outcome,
                    Err(_) => Outcome::Error,
                };
                samples.push(Sample {
                    outcome,
                    latency: t0.elapsed(),
                    answered: Instant::now(),
                });
                bar.inc(1);
            }
            samples
        }));
    }
    let mut samples = Vec::with_capacity(orders as usize);
    for c in clients {
        samples.extend(c.await?);
    }
    let secs = started.elapsed().as_secs_f64();
    bar.finish_and_clear();
    let failover = match failover {
        Some((task, _, pace, _)) => {
            let run = task.await??;
            Some(failover_report(&run, started, pace, &samples))
        }
        None => None,
    };

    let mut sold = 0;
    let mut left = 0;
    let mut oversold = 0;
    for sku in skus.iter() {
        let sold_sku = store.sold(sku).await?;
        sold += sold_sku;
        left += store.stock(sku).await?.unwrap_or(0);
        oversold += (sold_sku - options.stock).max(0);
    }
    // zklock's own view of the run, from every instance's /metrics.
    let lock_metrics = if mode.backend().is_some() {
        let mut m = LockMetrics::default();
        for (n, i) in instances.iter().enumerate() {
            let text = http
                .get(format!("http://{}/metrics", i.addr))
                .send()
                .await?
                .error_for_status()?
                .text()
                .await?;
            m.add_scrape(&text);
            // Kept beside the instance's log, to read what an exporter would have served.
            let kept = options
                .log_dir
                .join(mode.log_dir())
                .join(format!("metrics-{n}.txt"));
            std::fs::write(kept, &text)?;
        }
        Some(m)
    } else {
        None
    };
    let count = |o: Outcome| samples.iter().filter(|s| s.outcome == o).count() as u64;
    let mut latencies: Vec<Duration> = samples.iter().map(|s| s.latency).collect();
    latencies.sort();
    let report = ModeReport {
        mode,
        instances: instances.len() as u32,
        initial,
        orders,
        sold,
        left,
        oversold,
        answered_sold: count(Outcome::Sold),
        rejected: count(Outcome::OutOfStock),
        fenced: count(Outcome::Fenced),
        errors: count(Outcome::Error) + count(Outcome::UnknownSku),
        secs,
        p50: percentile(&latencies, 0.50),
        p99: percentile(&latencies, 0.99),
        lock_metrics,
        failover,
    };
    println!(
        "{}: {} orders in {:.1} s, {} sold of {} in stock",
        mode.title(),
        orders,
        secs,
        sold,
        initial
    );
    Ok(report)
}

/// What the failover did to the orders: how long they stalled, what sold after it.
fn failover_report(
    run: &FailoverRun,
    started: Instant,
    pace: Duration,
    samples: &[Sample],
) -> FailoverReport {
    let longest = |after: bool| {
        samples
            .iter()
            .filter(|s| (s.answered >= run.sent) == after)
            .map(|s| s.latency)
            .max()
            .unwrap_or_default()
    };
    FailoverReport {
        old_primary: run.old_primary.clone(),
        new_primary: run.new_primary.clone(),
        at: run.sent.saturating_duration_since(started),
        took: run.done.saturating_duration_since(run.sent),
        stall: longest(true),
        longest_before: longest(false),
        sold_after: samples
            .iter()
            .filter(|s| s.outcome == Outcome::Sold && s.answered >= run.done)
            .count() as u64,
        paced: if pace.is_zero() {
            0.0
        } else {
            1.0 / pace.as_secs_f64()
        },
    }
}

/// Places one order on the instance at `addr`.
async fn order(
    http: &reqwest::Client,
    addr: SocketAddr,
    sku: &str,
    order_id: &str,
    hold: bool,
) -> Result<OrderResponse, reqwest::Error> {
    http.post(format!("http://{addr}/skus/{sku}/orders"))
        .json(&OrderRequest {
            order_id: order_id.to_string(),
            hold,
        })
        .send()
        .await?
        .json::<OrderResponse>()
        .await
}

fn percentile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Sends SIGCONT on drop, so that no path leaves an instance frozen.
struct Frozen(u32);

impl Frozen {
    fn freeze(pid: u32) -> Result<Frozen, DemoError> {
        if instances::signal(pid, libc::SIGSTOP) {
            Ok(Frozen(pid))
        } else {
            Err(format!("SIGSTOP {pid}: {}", std::io::Error::last_os_error()).into())
        }
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        instances::signal(self.0, libc::SIGCONT);
    }
}

/// Instance 1 takes the lock of [`PAUSE_SKU`] (stock 1) and reads the stock; it is then
/// frozen (SIGSTOP) while instance 2 orders the same SKU. Instance 2 gets the lock only once
/// instance 1's session has expired (ZooKeeper) or its lease has run out (Redis; PostgreSQL,
/// whose server ends the silent session by `idle_session_timeout`), and sells
/// the unit. Instance 1 is then thawed (SIGCONT) and writes what it computed from its stale
/// read, with its old token: the store must refuse it.
async fn pause_scenario(
    options: &DemoOptions,
    backend: LockBackend,
    http: &reqwest::Client,
    store: &Store,
    instances: &[Instance],
) -> Result<PauseReport, DemoError> {
    let (Some(holder), Some(taker)) = (instances.first(), instances.get(1)) else {
        return Err("the pause scenario needs at least 2 instances".into());
    };
    println!(
        "pause scenario on {backend}: instance {} holds the lock of sku_{PAUSE_SKU} (stock 1), then gets SIGSTOP",
        holder.number
    );
    store.add(&[(PAUSE_SKU.to_string(), 1)]).await?;
    let mut events = store.dedicated_connection().await?;
    redis::cmd("DEL")
        .arg(HOLDING_EVENTS)
        .query_async::<()>(&mut events)
        .await?;

    let holder_order = "pause-holder";
    let stale = tokio::spawn({
        let (http, addr) = (http.clone(), holder.addr);
        async move { order(&http, addr, PAUSE_SKU, holder_order, true).await }
    });
    // Wait until the holder has the lock and has read the stock.
    let event: Option<(String, String)> = redis::cmd("BLPOP")
        .arg(HOLDING_EVENTS)
        .arg(60)
        .query_async(&mut events)
        .await?;
    let Some((_, event)) = event else {
        stale.abort();
        return Err("the holder did not take the lock within 60 s".into());
    };
    let mut parts = event.split(' ');
    let holder_token = parts.nth(2).unwrap_or("?").to_string();
    let frozen = Frozen::freeze(holder.pid())?;
    let paused_at = Instant::now();

    // Another instance orders the same SKU: it waits for the lock until the session expires
    // or the lease runs out.
    let taker_answer = order(http, taker.addr, PAUSE_SKU, "pause-taker", false).await?;
    let paused_for = paused_at.elapsed();
    drop(frozen); // SIGCONT: the holder goes on where it stopped, believing it holds the lock.
    redis::cmd("RPUSH")
        .arg(release_key(holder_order))
        .arg("go")
        .query_async::<()>(&mut events)
        .await?;
    let stale_answer = stale.await??;

    let sold = store.sold(PAUSE_SKU).await?;
    let left = store.stock(PAUSE_SKU).await?.unwrap_or(0);
    let report = PauseReport {
        backend,
        sku: PAUSE_SKU.to_string(),
        session_timeout: options.session_timeout,
        holder: holder.number,
        holder_token,
        paused_for,
        taker: taker.number,
        taker_outcome: taker_answer.outcome,
        taker_token: taker_answer.token.unwrap_or_else(|| "-".into()),
        stale_outcome: stale_answer.outcome,
        stale_stock_read: stale_answer.stock_read,
        store_token: stale_answer.store_token,
        stale_error: stale_answer.error,
        initial: 1,
        sold,
        left,
        oversold: (sold - 1).max(0),
    };
    Ok(report)
}
