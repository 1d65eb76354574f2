//! A scheduled job run by three instances: three processes, each with its own ZooKeeper
//! session, as three hosts of one service would be.
//!
//! Every instance's ticker fires the job once a second. `#[distributed_lock(..., skip_if_locked,
//! at_least = "3s")]` runs it on one instance; the others skip, and nobody runs it again within
//! 3 s of a run's start, even though the run itself takes 0.2 s and its lock is free again
//! long before. Each line says who ran it or skipped it, at what time by the server's clock.
//! The summary checks, from those server times, that no run started within 3 s of the one
//! before.
//!
//! ```sh
//! cargo run --example scheduled_job             # starts its own ZooKeeper for the run
//! ZKLOCK_CONNECT=host:2181 cargo run --example scheduled_job
//! ```
//!
//! The example runs itself three times as the instances (`ZKLOCK_EXAMPLE_INSTANCE` tells a
//! process that it is one); `tests/recipes/scheduled_job_example.rs` runs the same code.

// By path, so that the test that includes this file finds it too.
#[path = "common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use zklock::zookeeper_client::{self, Acls, CreateMode};
use zklock::{distributed_lock, Error, LockManager, Ran};

/// Instances, as separate processes.
const INSTANCES: usize = 3;
/// How often each instance fires the job.
const EVERY: Duration = Duration::from_secs(1);
/// The job's `at_least`, as its attribute says (in milliseconds of server time).
const AT_LEAST_MS: i64 = 3_000;
/// How long a run works.
const WORK: Duration = Duration::from_millis(200);
/// Tells a process that it is an instance, and which.
const INSTANCE_VAR: &str = "ZKLOCK_EXAMPLE_INSTANCE";
/// How long the instances fire the job, in seconds.
const SECS_VAR: &str = "ZKLOCK_EXAMPLE_SECS";

/// The job. Every instance calls it on every tick; the attribute runs its body on one of them
/// at a time, and on none within 3 s of a run's start. It returns the server's time at its
/// start.
#[distributed_lock("send-digest", skip_if_locked, at_least = "3s", at_most = "30s", manager = manager)]
async fn send_digest(manager: &LockManager, clock: &ServerClock) -> Result<Ran<i64>, Error> {
    let started = clock.now().await;
    tokio::time::sleep(WORK).await; // build and send the digest
    Ok(started)
}

fn main() {
    let secs = std::env::var(SECS_VAR)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    if let Err(violation) = run(Duration::from_secs(secs)).check() {
        eprintln!("{violation}");
        std::process::exit(1);
    }
}

/// In an instance process: fires the job for `secs` and returns `None`. In the launching
/// process: starts the instances, prints what they do as they do it, and returns the report.
pub fn run(duration: Duration) -> Report {
    if let Ok(instance) = std::env::var(INSTANCE_VAR) {
        let connect = std::env::var("ZKLOCK_CONNECT").expect("the launcher sets ZKLOCK_CONNECT");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(instance_main(&instance, &connect, duration));
        std::process::exit(0);
    }
    let (_server, connect) = common::zookeeper();
    println!(
        "{INSTANCES} instances fire the job every {EVERY:?} for {duration:?}; at_least = {}s",
        AT_LEAST_MS / 1000
    );
    fleet(&connect, duration)
}

/// One instance: a ticker that fires the job. Prints one line a tick for the launcher:
/// `ran <instance> <fired> <started>` or `skipped <instance> <fired>`, server times in ms.
async fn instance_main(instance: &str, connect: &str, duration: Duration) {
    let manager = LockManager::builder(connect)
        .identity(format!("instance-{instance}"))
        .zookeeper(|zk| zk.session_timeout(Duration::from_secs(4)))
        .connect()
        .await
        .expect("connect to ZooKeeper");
    let clock = ServerClock::new(&manager).await;
    let mut ticker = tokio::time::interval(EVERY);
    let end = tokio::time::Instant::now() + duration;
    while tokio::time::Instant::now() < end {
        ticker.tick().await;
        // The server's time before the call: a run's claim on the server comes after it.
        let fired = clock.now().await;
        match send_digest(&manager, &clock).await {
            Ok(Ran::Ran(started)) => println!("ran {instance} {fired} {started}"),
            Ok(Ran::Skipped) => println!("skipped {instance} {fired}"),
            Err(err) => println!("error {instance} {fired} {err}"),
        }
    }
    manager.flush().await;
}

/// The server's clock: the mtime of a write to this instance's own ephemeral znode.
struct ServerClock {
    client: zookeeper_client::Client,
    path: String,
}

impl ServerClock {
    async fn new(manager: &LockManager) -> ServerClock {
        let client = manager
            .client::<zookeeper_client::Client>()
            .expect("a ZooKeeper manager");
        let path = format!("/zklock-example-clock-{}", std::process::id());
        let ephemeral = CreateMode::Ephemeral.with_acls(Acls::anyone_all());
        client
            .create(&path, b"", &ephemeral)
            .await
            .expect("create the clock node");
        ServerClock { client, path }
    }

    /// The server's time now, in milliseconds since the epoch.
    async fn now(&self) -> i64 {
        let stat = self
            .client
            .set_data(&self.path, b"", None)
            .await
            .expect("write the clock node");
        stat.mtime
    }
}

/// What the instances did.
#[derive(Debug, Default)]
pub struct Report {
    /// Runs: (instance, server time before the call, server time at the body's start).
    pub runs: Vec<(String, i64, i64)>,
    /// Skips: (instance, server time before the call).
    pub skips: Vec<(String, i64)>,
    /// Errors, as the instances printed them.
    pub errors: Vec<String>,
}

/// Starts the instances and gathers their lines until all have exited.
fn fleet(connect: &str, duration: Duration) -> Report {
    let exe = std::env::current_exe().expect("the example's own path");
    let (tx, rx) = mpsc::channel::<String>();
    let mut children = Vec::new();
    for instance in 0..INSTANCES {
        let mut child = Command::new(&exe)
            .env(INSTANCE_VAR, instance.to_string())
            .env("ZKLOCK_CONNECT", connect)
            .env(SECS_VAR, duration.as_secs().to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start an instance");
        let stdout = BufReader::new(child.stdout.take().unwrap());
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in stdout.lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        children.push(child);
    }
    drop(tx);
    let mut report = Report::default();
    let mut first: Option<i64> = None;
    for line in rx {
        let fields: Vec<&str> = line.splitn(4, ' ').collect();
        let at = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<i64>().ok())
                .unwrap_or(0)
        };
        let (what, instance) = (fields[0], fields.get(1).copied().unwrap_or("?"));
        let shown = if what == "ran" { at(3) } else { at(2) };
        let since = shown - *first.get_or_insert(shown);
        match what {
            "ran" => {
                println!(
                    "{} (+{:>6.3} s)  instance {instance} RAN the job",
                    clock_time(shown),
                    since as f64 / 1000.0
                );
                report.runs.push((instance.into(), at(2), at(3)));
            }
            "skipped" => {
                println!(
                    "{} (+{:>6.3} s)  instance {instance} skipped",
                    clock_time(shown),
                    since as f64 / 1000.0
                );
                report.skips.push((instance.into(), at(2)));
            }
            _ => {
                println!("instance {instance}: {line}");
                report.errors.push(line);
            }
        }
    }
    for mut child in children {
        let status = child.wait().expect("wait for an instance");
        if !status.success() {
            report
                .errors
                .push(format!("an instance exited with {status}"));
        }
    }
    report
}

/// `HH:MM:SS.mmm UTC` of a server time in ms since the epoch.
fn clock_time(ms: i64) -> String {
    let day_ms = ms.rem_euclid(86_400_000);
    format!(
        "{:02}:{:02}:{:02}.{:03} UTC",
        day_ms / 3_600_000,
        day_ms / 60_000 % 60,
        day_ms / 1000 % 60,
        day_ms % 1000
    )
}

impl Report {
    /// Prints the summary and checks that no run started within `at_least` of the one before.
    ///
    /// A run's start on the server (its claim of the window) lies between the two server
    /// times its instance took: before the call and at the body's start. So if runs A and B
    /// (B after A) were at least 3 s apart, B's body started at least 3 s after A's call.
    pub fn check(&self) -> Result<(), String> {
        let mut runs = self.runs.clone();
        runs.sort_by_key(|run| run.2);
        let starts: Vec<String> = runs
            .iter()
            .map(|(instance, _, started)| {
                format!(
                    "instance {instance} at {:.3} s",
                    (started - runs[0].2) as f64 / 1000.0
                )
            })
            .collect();
        println!(
            "\n{} runs ({}), {} skips, {} errors",
            runs.len(),
            starts.join(", "),
            self.skips.len(),
            self.errors.len()
        );
        if let Some(error) = self.errors.first() {
            return Err(format!("an instance failed: {error}"));
        }
        if runs.is_empty() {
            return Err("nobody ran the job".into());
        }
        for pair in runs.windows(2) {
            let ((a, a_fired, a_started), (b, _, b_started)) = (&pair[0], &pair[1]);
            if b_started - a_fired < AT_LEAST_MS {
                return Err(format!(
                    "the job ran twice within {AT_LEAST_MS} ms: instance {a} at {a_started}, instance {b} at {b_started} (server ms)"
                ));
            }
        }
        let gaps: Vec<String> = runs
            .windows(2)
            .map(|pair| format!("{:.3} s", (pair[1].2 - pair[0].2) as f64 / 1000.0))
            .collect();
        println!(
            "never twice within at_least = {} s: the runs started {} apart (server time)",
            AT_LEAST_MS / 1000,
            if gaps.is_empty() {
                "-".to_string()
            } else {
                gaps.join(", ")
            }
        );
        Ok(())
    }
}
