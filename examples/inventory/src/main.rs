//! `zklock-inventory serve` runs one instance of the inventory service;
//! `zklock-inventory demo` runs the whole anti-oversell demo, on every lock backend.

use std::io::Write;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use zklock::LockManager;
use zklock_inventory::backends::{LockBackend, LockService};
use zklock_inventory::driver::{self, DemoOptions, Mode};
use zklock_inventory::instances::LISTENING;
use zklock_inventory::report;
use zklock_inventory::service::{self, AppState, Config};
use zklock_inventory::store::Store;
use zklock_testkit::RedisServer;

/// An inventory service that does not oversell, on zklock's locks (ZooKeeper, Redis or
/// PostgreSQL) and
/// stock in Redis; and its demo.
#[derive(Parser, Debug)]
#[command(name = "zklock-inventory", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run one instance of the service.
    Serve(ServeArgs),
    /// Run the demo: several instances, many clients, without the lock and with it on each
    /// lock backend.
    Demo(DemoArgs),
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Address to listen on (port 0 picks a free one; the address is printed on stdout).
    #[arg(long, default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Redis holding the stock.
    #[arg(
        long,
        env = "ZKLOCK_INVENTORY_REDIS",
        default_value = "redis://127.0.0.1:6379/"
    )]
    redis: String,
    /// The lock service: a ZooKeeper connect string (`host:port,...`), a Redis URL
    /// (`redis://host:port/`) or a PostgreSQL URL (`postgres://user@host:port/db`).
    #[arg(
        long,
        alias = "zk",
        env = "ZKLOCK_CONNECT",
        default_value = "127.0.0.1:2181"
    )]
    lock: String,
    /// Take no lock (and so no fencing): shows the oversell.
    #[arg(long)]
    no_lock: bool,
    /// This instance's number, reported in answers.
    #[arg(long, default_value_t = 1)]
    instance: u32,
    /// ZooKeeper session timeout, or Redis, PostgreSQL, etcd and MySQL lease: how long a frozen or cut-off instance keeps
    /// its locks.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10s")]
    session_timeout: Duration,
    /// Simulated work (pricing, payment) between reading and writing the stock.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    work: Duration,
    /// Honour the debug `hold` field of orders (for the pause scenario only).
    #[arg(long)]
    debug_hold: bool,
}

#[derive(Args, Debug)]
struct DemoArgs {
    /// Instances (separate processes) of the service.
    #[arg(long, default_value_t = 4)]
    instances: u32,
    /// Concurrent clients, spread over the instances.
    #[arg(long, default_value_t = 64)]
    clients: u32,
    /// SKUs.
    #[arg(long, default_value_t = 10)]
    skus: u32,
    /// Initial stock of each SKU.
    #[arg(long, default_value_t = 200)]
    stock: i64,
    /// Orders placed, as a multiple of the total stock.
    #[arg(long, default_value_t = 3.0)]
    demand: f64,
    /// Simulated work (pricing, payment) between reading and writing the stock; the default
    /// has none: the separate Redis round trips alone let orders overlap.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    work: Duration,
    /// ZooKeeper session timeout and Redis, PostgreSQL, etcd and MySQL lease of the instances (the pause scenario waits
    /// this long).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "3s")]
    session_timeout: Duration,
    /// Also run the pause scenario on each lock backend: a lock holder frozen past its
    /// session timeout or lease.
    #[arg(long)]
    pause: bool,
    /// Modes to run, in order: `nolock`, a lock backend (`zk`, `redis`, `postgres`, `etcd`, `mysql`),
    /// or `lock` for every one of those; and `redis-sentinel` (not part of `lock`): Redis with
    /// 2 replicas and 3 Sentinels, the primary failed over in the middle of the orders.
    #[arg(long, value_delimiter = ',', default_value = "nolock,lock")]
    modes: Vec<String>,
    /// With `redis-sentinel`: how long its orders last, paced evenly so that they keep
    /// flowing across the failover (sent once a quarter of the stock has been ordered).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "12s")]
    failover_span: Duration,
    /// No progress bar.
    #[arg(long)]
    no_progress: bool,
    /// Keep the instances' logs and their last `/metrics` scrapes (`<mode>/metrics-N.txt`)
    /// after the demo, in a directory it prints, instead of deleting them.
    #[arg(long)]
    keep_logs: bool,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve(args),
        Command::Demo(args) => demo(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("zklock-inventory: {e}");
            ExitCode::FAILURE
        }
    }
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

fn serve(args: ServeArgs) -> Result<ExitCode, BoxError> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        service::install_metrics()?;
        let manager = if args.no_lock {
            None
        } else {
            // Each backend takes the setting it has: ZooKeeper the session timeout, Redis and
            // PostgreSQL the lease.
            let builder = LockManager::builder(args.lock.as_str());
            let silence = args.session_timeout;
            let manager = match zklock::BackendKind::of(&args.lock)? {
                zklock::BackendKind::Redis => builder.redis(|r| r.lease(silence)),
                zklock::BackendKind::Postgres => builder.postgres(|pg| pg.lease(silence)),
                // etcd counts its leases in whole seconds, 2 at least.
                zklock::BackendKind::Etcd => builder.etcd(|e| {
                    e.lease(Duration::from_secs(
                        silence.as_secs_f64().ceil().max(2.0) as u64
                    ))
                }),
                // MySQL counts wait_timeout in whole seconds.
                zklock::BackendKind::MySql => builder.mysql(|my| {
                    my.lease(Duration::from_secs(
                        silence.as_secs_f64().ceil().max(1.0) as u64
                    ))
                }),
                _ => builder.zookeeper(|zk| zk.session_timeout(silence)),
            }
            .connect()
            .await?;
            Some(manager)
        };
        let store = Store::connect(&args.redis).await?;
        let config = Config {
            instance: args.instance,
            manager: manager.clone(),
            debug_hold: args.debug_hold,
            work: args.work,
        };
        let listener = tokio::net::TcpListener::bind(args.listen).await?;
        let addr = listener.local_addr()?;
        eprintln!(
            "instance {}: {}, redis {}, {LISTENING}{addr}",
            args.instance,
            match &manager {
                Some(_) => format!(
                    "locking on {} at {}",
                    LockBackend::of_connect_string(&args.lock),
                    args.lock
                ),
                None => "no lock".to_string(),
            },
            args.redis
        );
        {
            let mut stdout = std::io::stdout().lock();
            writeln!(stdout, "instance {} {LISTENING}{addr}", args.instance)?;
            stdout.flush()?;
        }
        service::serve(listener, AppState::new(config, store), shutdown_signal()).await?;
        if let Some(manager) = manager {
            manager.flush().await;
        }
        Ok(ExitCode::SUCCESS)
    })
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
}

fn demo(args: DemoArgs) -> Result<ExitCode, BoxError> {
    let mut modes = Vec::new();
    for m in &args.modes {
        if m == "lock" {
            modes.extend(LockBackend::ALL.map(Mode::Lock));
        } else {
            modes.push(m.parse::<Mode>()?);
        }
    }
    if args.pause && args.instances < 2 {
        return Err("the pause scenario needs --instances 2 or more".into());
    }
    if args.instances == 0 || args.clients == 0 || args.skus == 0 || args.stock <= 0 {
        return Err("instances, clients, skus and stock must be positive".into());
    }
    // One lock service per backend the modes lock on: ZKLOCK_CONNECT's, for the backend it
    // names, else a throwaway server.
    let given = std::env::var("ZKLOCK_CONNECT")
        .ok()
        .filter(|c| !c.trim().is_empty())
        .map(LockService::external);
    let mut locks: Vec<LockService> = Vec::new();
    if let Some(given) = given
        .into_iter()
        .find(|g| modes.contains(&Mode::Lock(g.backend)))
    {
        println!(
            "locks on {}: {} (from ZKLOCK_CONNECT)",
            given.backend, given.connect
        );
        locks.push(given);
    }
    for mode in &modes {
        let Some(backend) = mode.backend() else {
            continue;
        };
        if locks.iter().all(|l| l.backend != backend) {
            let service = LockService::start(backend)?;
            println!("locks on {backend}: started on {}", service.connect);
            locks.push(service);
        }
    }
    let redis = RedisServer::start().map_err(|e| format!("starting redis-server: {e}"))?;
    println!("stock in Redis: started on {}", redis.url());
    let logs = tempfile::Builder::new()
        .prefix("zklock-inventory-logs-")
        .tempdir()?;
    let options = DemoOptions {
        exe: std::env::current_exe()?,
        redis: redis.url(),
        locks,
        instances: args.instances,
        clients: args.clients,
        skus: args.skus,
        stock: args.stock,
        demand: args.demand,
        work: args.work,
        session_timeout: args.session_timeout,
        modes,
        pause: args.pause,
        failover_span: args.failover_span,
        progress: !args.no_progress,
        log_dir: logs.path().to_path_buf(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // On Ctrl-C the driver is dropped (its instances are killed), then the servers stop.
    let results = runtime.block_on(async {
        tokio::select! {
            results = driver::run(&options) => results,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
        }
    })?;
    drop(runtime);
    print!("{}", report::render(&results));
    if args.keep_logs {
        let kept = logs.keep();
        eprintln!(
            "instance logs and /metrics scrapes kept in {}",
            kept.display()
        );
    }
    let locked_ok = results
        .modes
        .iter()
        .filter(|r| r.mode != Mode::NoLock)
        .all(|r| r.oversold == 0);
    let pause_ok = results.pauses.iter().all(|p| p.stale_rejected());
    Ok(if locked_ok && pause_ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
