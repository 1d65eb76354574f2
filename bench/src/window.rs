//! The timed window that every acquire/release loop shares, whatever the backend: the
//! critical section (exclusion check and holder changes), what each worker records, and the
//! gate that opens the window only once every worker has connected and acquired once, and the
//! time and CPU the window took.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::{watch, Barrier};

use crate::cpu::CpuTimes;
use crate::report::Report;
use crate::{BenchError, Result};

/// Counts moments when two holders of one key overlap (CuratorBench's `violations`), and
/// remembers each key's last holder (to count holder changes).
pub(crate) struct Overlap {
    holders: Vec<AtomicUsize>,
    /// Worker index + 1 of each key's last holder (0: none yet).
    last: Vec<AtomicUsize>,
    pub(crate) violations: AtomicU64,
}

impl Overlap {
    pub(crate) fn new(keys: usize) -> Overlap {
        Overlap {
            holders: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
            last: (0..keys).map(|_| AtomicUsize::new(0)).collect(),
            violations: AtomicU64::new(0),
        }
    }

    /// The critical section of worker `who`: enter key `k`, let the other tasks run once,
    /// leave. Whether the key changed hands (its last holder was another worker).
    pub(crate) async fn critical_section(&self, k: usize, who: usize) -> bool {
        if self.holders[k].fetch_add(1, Ordering::SeqCst) != 0 {
            self.violations.fetch_add(1, Ordering::SeqCst);
        }
        let changed = self.last[k].swap(who + 1, Ordering::SeqCst) != who + 1;
        tokio::task::yield_now().await;
        self.holders[k].fetch_sub(1, Ordering::SeqCst);
        changed
    }
}

/// What one worker recorded in the window.
#[derive(Debug, Default)]
pub(crate) struct Tally {
    /// Each cycle's acquire + release, in ns.
    pub(crate) latencies: Vec<u64>,
    /// The longest acquire (from the call to the grant), in ns.
    pub(crate) max_wait_ns: u64,
    /// Cycles whose grant went to another worker than the key's last holder.
    pub(crate) changes: u64,
}

impl Tally {
    pub(crate) fn with_capacity(cycles: usize) -> Tally {
        Tally {
            latencies: Vec::with_capacity(cycles),
            ..Tally::default()
        }
    }

    /// One cycle that started at `t0`, was granted after `waited`, and (`changed`) took the
    /// key from another worker.
    pub(crate) fn record(&mut self, t0: Instant, waited: Duration, changed: bool) {
        self.latencies.push(t0.elapsed().as_nanos() as u64);
        self.max_wait_ns = self.max_wait_ns.max(waited.as_nanos() as u64);
        self.changes += u64::from(changed);
    }

    /// Adds another worker's tally.
    pub(crate) fn merge(&mut self, other: Tally) {
        self.latencies.extend(other.latencies);
        self.max_wait_ns = self.max_wait_ns.max(other.max_wait_ns);
        self.changes += other.changes;
    }

    /// Every worker's tally, merged once each has ended: the first worker's error, if any.
    pub(crate) async fn gather(
        workers: impl IntoIterator<Item = tokio::task::JoinHandle<Result<Tally>>>,
    ) -> Result<Tally> {
        let mut tally = Tally::default();
        for worker in workers {
            let mine = worker
                .await
                .map_err(|e| BenchError(format!("worker panicked: {e}")))??;
            tally.merge(mine);
        }
        Ok(tally)
    }
}

/// Opens the timed window for `workers` workers: each does its untimed first cycle, then
/// [`Gate::ready`]; the run's task calls [`Gate::all_ready`] (every worker connected and
/// acquired once; read the server's counters now), then [`Gate::open`].
pub(crate) struct Gate {
    ready: Barrier,
    go: watch::Sender<bool>,
}

impl Gate {
    pub(crate) fn new(workers: usize) -> Gate {
        Gate {
            ready: Barrier::new(workers + 1),
            go: watch::channel(false).0,
        }
    }

    /// A worker's first cycle is done (or failed): waits until the window opens.
    pub(crate) async fn ready(&self) {
        let mut go = self.go.subscribe();
        self.ready.wait().await;
        let _ = go.wait_for(|go| *go).await;
    }

    /// Waits until every worker is ready.
    pub(crate) async fn all_ready(&self) {
        self.ready.wait().await;
    }

    /// Opens the window, reading the CPU time of this process and of the server's (`server`:
    /// its process id, if known) as it opens.
    pub(crate) fn open(&self, server: Option<u32>) -> Window {
        let cpu = CpuTimes::now(server);
        let opened = Instant::now();
        self.go.send_replace(true);
        Window {
            opened,
            cpu,
            server,
        }
    }
}

/// An open timed window: when it opened, and the CPU times read then.
pub(crate) struct Window {
    opened: Instant,
    cpu: CpuTimes,
    server: Option<u32>,
}

impl Window {
    /// Closes it once every worker finished: how long it was open, and the CPU times now.
    pub(crate) fn close(self) -> Closed {
        Closed {
            elapsed: self.opened.elapsed(),
            cpu_before: self.cpu,
            cpu: CpuTimes::now(self.server),
        }
    }
}

/// A closed window: how long it was open, and the CPU spent in it.
pub(crate) struct Closed {
    pub(crate) elapsed: Duration,
    cpu_before: CpuTimes,
    cpu: CpuTimes,
}

impl Closed {
    /// Adds the CPU time spent in the window per cycle to `report` (see [`CpuTimes`]).
    pub(crate) fn push_cpu(&self, cycles: u64, report: &mut Report) {
        self.cpu.push_since(self.cpu_before, cycles, report);
    }
}
