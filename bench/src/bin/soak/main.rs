//! `zklock-soak`: a long run of mixed traffic on each backend, with periodic faults, that
//! prints how this process's memory, file descriptors and threads, and what the server keeps
//! for it, grow with the number of cycles once warmed up, and each work's longest cycle (where
//! a worker that stands still shows). `scripts/soak --minutes N` runs it
//! (release build) on every backend in turn; figures are printed, never asserted (a bounded
//! sample runs in the bench's smoke test, which checks that a drained run leaves nothing on
//! the server).
//!
//! Traffic: two managers (one with the local queue, one without and with a 50 ms linger), each
//! with mutex workers on three keys, a `try_lock` worker, a worker whose acquires are dropped
//! after 1 to 5 ms, readers and writers of one read/write lock, a job with a 20 ms window, a
//! leader election, and a semaphore of 2 where the backend has them.

mod probe;
mod traffic;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use probe::{Sample, Server};
use traffic::Counts;
use zklock_core::LockManager;

#[derive(Parser, Debug)]
#[command(about = "Soak zklock's backends and print growth per million cycles")]
struct Args {
    /// zookeeper, redis, postgres, or all (in turn)
    #[arg(long, default_value = "all")]
    backend: String,
    /// How long each backend runs, in seconds (unless --minutes)
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// How long each backend runs, in minutes
    #[arg(long)]
    minutes: Option<u64>,
    /// Seconds between samples
    #[arg(long, default_value_t = 5)]
    sample_secs: u64,
    /// Seconds between faults (Redis: every connection cut; PostgreSQL: one session ended)
    #[arg(long, default_value_t = 20)]
    fault_secs: u64,
    /// The share of the run before growth is measured
    #[arg(long, default_value_t = 0.2)]
    warmup: f64,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), String> {
    let args = Args::parse();
    let backends: Vec<&str> = match args.backend.as_str() {
        "all" => vec!["zookeeper", "redis", "postgres"],
        one => vec![one],
    };
    let secs = args.minutes.map_or(args.seconds, |m| m * 60);
    for backend in backends {
        soak(backend, Duration::from_secs(secs), &args).await?;
    }
    Ok(())
}

async fn managers(connect: &str) -> Result<Vec<LockManager>, String> {
    let first = LockManager::builder(connect)
        .namespace("/zklock/soak")
        .identity("soak-1")
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    let second = LockManager::builder(connect)
        .namespace("/zklock/soak")
        .identity("soak-2")
        .local_queue(false)
        .linger(Duration::from_millis(50))
        .connect()
        .await
        .map_err(|e| e.to_string())?;
    Ok(vec![first, second])
}

async fn soak(backend: &str, length: Duration, args: &Args) -> Result<(), String> {
    let mut server = Server::start(backend).await?;
    let managers = managers(&server.connect()).await?;
    let counts = Arc::new(Counts::default());
    let workers = traffic::start(&managers, &counts, server.semaphores());
    let started = Instant::now();
    let mut samples = vec![server.sample(0).await];
    let mut faults = 0;
    let mut next_fault = started + Duration::from_secs(args.fault_secs);
    while started.elapsed() < length {
        tokio::time::sleep(Duration::from_secs(args.sample_secs)).await;
        if Instant::now() >= next_fault {
            let what = server.fault().await;
            if what != "none" {
                faults += 1;
            }
            next_fault += Duration::from_secs(args.fault_secs);
        }
        let cycles = counts.cycles.load(Ordering::Relaxed);
        samples.push(server.sample(cycles).await);
    }
    counts.stop.store(true, Ordering::Relaxed);
    for worker in workers {
        if tokio::time::timeout(Duration::from_secs(30), worker)
            .await
            .is_err()
        {
            return Err(format!("soak {backend}: a worker did not stop within 30 s"));
        }
    }
    for m in &managers {
        m.flush().await;
    }
    let elapsed = started.elapsed();
    let cycles = counts.cycles.load(Ordering::Relaxed);
    let drained = server.sample(cycles).await;
    drop(managers);
    report(
        backend,
        &samples,
        &drained,
        elapsed,
        &counts,
        faults,
        args.warmup,
    );
    Ok(())
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// `first..last (min..max)` of one count over the samples after warm-up.
fn range(values: impl Iterator<Item = u64> + Clone) -> (u64, u64, u64, u64) {
    let first = values.clone().next().unwrap_or(0);
    let last = values.clone().last().unwrap_or(0);
    let min = values.clone().min().unwrap_or(0);
    let max = values.max().unwrap_or(0);
    (first, last, min, max)
}

fn report(
    backend: &str,
    samples: &[Sample],
    drained: &Sample,
    elapsed: Duration,
    counts: &Counts,
    faults: u32,
    warmup: f64,
) {
    let cycles = drained.cycles;
    let errors = counts.errors.load(Ordering::Relaxed);
    let secs = elapsed.as_secs_f64();
    println!(
        "soak {backend}: {cycles} cycles in {secs:.0} s ({:.0}/s), {errors} failed cycles, {faults} faults",
        cycles as f64 / secs
    );
    let warm = &samples[((samples.len() as f64 * warmup).ceil() as usize).min(samples.len() - 1)..];
    let points: Vec<(f64, f64)> = warm
        .iter()
        .map(|s| (s.cycles as f64, s.rss_kb as f64 / 1024.0))
        .collect();
    let per_million = slope(&points) * 1e6;
    let (first, last, _, _) = range(warm.iter().map(|s| s.rss_kb));
    println!(
        "  rss {:.1} MB at start, {:.1} -> {:.1} MB after warm-up: {per_million:+.3} MB per million cycles ({} samples from cycle {})",
        samples[0].rss_kb as f64 / 1024.0,
        first as f64 / 1024.0,
        last as f64 / 1024.0,
        warm.len(),
        warm.first().map_or(0, |s| s.cycles)
    );
    let series: Vec<String> = samples
        .iter()
        .map(|s| format!("{:.1}", s.rss_kb as f64 / 1024.0))
        .collect();
    println!("  rss by sample (MB): {}", series.join(" "));
    let mut line = String::from("  after warm-up (first -> last, min..max):");
    let mut result = format!(
        "soak-result backend={backend} cycles={cycles} secs={secs:.0} failed={errors} faults={faults} rss_mb_per_million={per_million:.3}"
    );
    let mut counted: Vec<(&str, Vec<u64>)> = vec![
        ("fds", warm.iter().map(|s| s.fds).collect()),
        ("threads", warm.iter().map(|s| s.threads).collect()),
    ];
    for (i, (name, _)) in warm[0].server.iter().enumerate() {
        counted.push((name, warm.iter().map(|s| s.server[i].1).collect()));
    }
    for (name, values) in &counted {
        let (first, last, min, max) = range(values.iter().copied());
        line.push_str(&format!(" {name} {first} -> {last} ({min}..{max});"));
        result.push_str(&format!(" {name}_growth={}", last as i64 - first as i64));
    }
    println!("{line}");
    println!("  drained:{}", drained.server_text());
    let longest = counts.longest.lock().expect("not poisoned");
    let by_work: Vec<String> = longest
        .iter()
        .map(|(work, d)| format!("{work} {} ms", d.as_millis()))
        .collect();
    println!("  longest cycle by work: {}", by_work.join(", "));
    let slowest = longest.values().max().copied().unwrap_or_default();
    result.push_str(&format!(" longest_cycle_ms={}", slowest.as_millis()));
    let kinds = counts.kinds.lock().expect("not poisoned");
    let mut kinds: Vec<(&String, &u64)> = kinds.iter().collect();
    kinds.sort_by(|a, b| b.1.cmp(a.1));
    for (kind, n) in kinds.iter().take(5) {
        println!("  failed {n}x: {kind}");
    }
    result.push_str(&drained.server_text().replace(' ', " drained_"));
    println!("{result}");
}
