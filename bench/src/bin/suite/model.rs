//! What the suite runs: rows of cells (one peer's way of running one workload), the figure a
//! row compares, and its target.

use std::collections::BTreeMap;
use std::path::PathBuf;

use zklock_bench::Report;

/// What a row's throughput column shows.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Metric {
    /// ops_per_s, with p50/p99.
    Ops,
    /// handoffs_per_s.
    Drain,
    /// peak_kb (lower is better).
    Memory,
}

/// One way of running one peer on one row.
#[derive(Clone, Debug)]
pub(crate) enum Runner {
    /// `zklock-bench --peer <peer>`, optionally `--no-local-queue`, `--no-fencing-tokens`.
    Ours {
        peer: &'static str,
        no_queue: bool,
        no_tokens: bool,
    },
    /// `zklock-bench --peer <peer>` on another connect string than the section's (Sentinel:
    /// the primary's own address).
    OursAt { peer: &'static str, connect: String },
    /// `zklock-bench --peer zklock --replica-acks <n>` on the section's connect string.
    Acked(u32),
    /// `zklock-bench --peer zklock` on a server of its own, plain or over TLS (the TLS
    /// section's cells, each on its backend's plain or TLS server).
    On(Server),
    /// The test kit's `peers/run <curator|kazoo>`.
    Peer(&'static str),
    /// `java CuratorMem`.
    CuratorMem,
}

impl Runner {
    /// `zklock-bench --peer <peer>` with the local queue on.
    pub(crate) fn ours(peer: &'static str) -> Runner {
        Runner::Ours {
            peer,
            no_queue: false,
            no_tokens: false,
        }
    }

    /// zklock with the local queue on and without fencing tokens.
    pub(crate) fn untokened() -> Runner {
        Runner::Ours {
            peer: "zklock",
            no_queue: false,
            no_tokens: true,
        }
    }
}

/// A server a cell runs zklock on, and how zklock connects to it.
#[derive(Clone, Debug)]
pub(crate) struct Server {
    /// Its connect string.
    pub(crate) connect: String,
    /// Its process, when it runs on this machine: the run then reports its CPU time.
    pub(crate) pid: Option<u32>,
    /// The certificates zklock speaks TLS with; none: plaintext.
    pub(crate) tls: Option<ClientTls>,
}

/// What a TLS client is given: the CA it trusts, and the certificate and key it presents
/// (mutual TLS).
#[derive(Clone, Debug)]
pub(crate) struct ClientTls {
    pub(crate) ca: PathBuf,
    pub(crate) cert: PathBuf,
    pub(crate) key: PathBuf,
}

/// One row of a table: one workload, run by each of its cells.
#[derive(Clone, Debug)]
pub(crate) struct Row {
    pub(crate) title: String,
    pub(crate) workload: &'static str,
    pub(crate) workers: usize,
    pub(crate) cycles: usize,
    pub(crate) keys: usize,
    pub(crate) metric: Metric,
    /// (column key, how that peer runs).
    pub(crate) cells: Vec<(&'static str, Runner)>,
    pub(crate) target: Option<Target>,
}

impl Row {
    /// An `Ops` row of `workload` on one key with no target.
    pub(crate) fn ops(
        title: impl Into<String>,
        workload: &'static str,
        workers: usize,
        cycles: usize,
        cells: Vec<(&'static str, Runner)>,
    ) -> Row {
        Row {
            title: title.into(),
            workload,
            workers,
            cycles,
            keys: 1,
            metric: Metric::Ops,
            cells,
            target: None,
        }
    }

    /// A `Drain` row (handoffs per second) of `waiters` queued in one process on one key,
    /// with no target.
    pub(crate) fn drain(
        title: impl Into<String>,
        waiters: usize,
        cells: Vec<(&'static str, Runner)>,
    ) -> Row {
        Row {
            title: title.into(),
            workload: "drain",
            workers: waiters,
            cycles: 0,
            keys: 1,
            metric: Metric::Drain,
            cells,
            target: None,
        }
    }

    /// The same row over `keys` keys.
    pub(crate) fn over_keys(mut self, keys: usize) -> Row {
        self.keys = keys;
        self
    }

    /// The same row with `target`.
    pub(crate) fn with_target(mut self, target: Target) -> Row {
        self.target = Some(target);
        self
    }

    /// Whether the row is contended on one key: its lines carry holder changes and the
    /// longest wait.
    pub(crate) fn contended(&self) -> bool {
        self.metric == Metric::Ops && self.workers > 1 && self.keys == 1
    }

    /// The figure that picks each cell's median run: the one its target judges first, else
    /// the row's throughput.
    pub(crate) fn ranked_by(&self) -> Figure {
        match &self.target {
            Some(Target::Ratios(wants)) => wants.first().map_or(Figure::Main, |w| w.figure),
            _ => Figure::Main,
        }
    }
}

/// A figure of a run's line that a target compares.
#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Figure {
    /// The row's metric: throughput, handoffs per second, or peak memory.
    Main,
    /// `holder_changes_per_s`.
    HolderChanges,
    /// `p99_us` (lower is better).
    P99,
    /// `client_cpu_us_per_cycle` (lower is better).
    ClientCpu,
}

/// One part of a target: zklock's figure against a peer's, as a ratio bound.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Want {
    /// The peer's column.
    pub(crate) peer: &'static str,
    pub(crate) figure: Figure,
    /// zklock's figure over the peer's: at least this (throughputs, holder changes) or at
    /// most this (p99; for memory the peer's over zklock's is at least this).
    pub(crate) ratio: f64,
}

impl Want {
    /// zklock's main figure at least `ratio`× the peer's (memory: the peer's at least `ratio`×
    /// zklock's).
    pub(crate) fn main(peer: &'static str, ratio: f64) -> Want {
        Want {
            peer,
            figure: Figure::Main,
            ratio,
        }
    }
}

/// A row's target.
#[derive(Clone, Debug)]
pub(crate) enum Target {
    /// Every ratio met.
    Ratios(Vec<Want>),
    /// A peak of at most this many MB (memory rows).
    PeakMb(f64),
    /// zklock's median run shows at most `max` of a per-cycle count (`field`, e.g.
    /// `round_trips_per_cycle`), named `name` in the table: what its protocol must cost.
    PerCycleAtMost {
        field: &'static str,
        name: &'static str,
        max: f64,
    },
    /// Every one of these met: a protocol's cost per cycle and its lead over the peers, say.
    All(Vec<Target>),
}

/// The sizes of the Redis and PostgreSQL sections' rows: cycles per worker or task, and the
/// drain's waiters.
pub(crate) struct BackendSizes {
    pub(crate) uncontended: usize,
    pub(crate) contended: usize,
    pub(crate) keys: usize,
    pub(crate) inproc: usize,
    pub(crate) drain: usize,
}

/// What one run gave: its line, or why there is none.
pub(crate) type Outcome = Result<Report, String>;

/// One row's outcomes, by column.
pub(crate) type Cells = BTreeMap<&'static str, Outcome>;

/// A run's figure for `figure` on a row of `metric`.
pub(crate) fn figure_of(metric: Metric, which: Figure, report: &Report) -> Option<f64> {
    match which {
        Figure::Main => figure(metric, report),
        Figure::HolderChanges => report.number("holder_changes_per_s"),
        Figure::P99 => report.number("p99_us"),
        Figure::ClientCpu => report.number("client_cpu_us_per_cycle"),
    }
}

/// A run's main figure on a row of `metric`.
pub(crate) fn figure(metric: Metric, report: &Report) -> Option<f64> {
    match metric {
        Metric::Ops => report.number("ops_per_s"),
        Metric::Drain => report.number("handoffs_per_s"),
        Metric::Memory => report.number("peak_kb"),
    }
}

/// A column's main figure in `cells`, if it ran.
pub(crate) fn value(metric: Metric, cells: &Cells, column: &str) -> Option<f64> {
    cells
        .get(column)
        .and_then(|o| o.as_ref().ok())
        .and_then(|r| figure(metric, r))
}

/// One row's runs: every round's outcomes, and the median run of each cell.
#[derive(Debug, Default)]
pub(crate) struct RowRuns {
    /// Each cell's median run (see `rounds`).
    pub(crate) kept: Cells,
    /// Every round's outcomes, in the order they ran.
    pub(crate) rounds: Vec<Cells>,
}

impl RowRuns {
    /// zklock's ratio to `peer` on `which`, paired by round: the median, over the rounds in
    /// which both ran, of zklock's figure over the peer's in that round (for memory, the
    /// peer's over zklock's). Runs side by side in one round meet the same load, so the ratio
    /// keeps out a drift that the medians of each cell alone would let in.
    pub(crate) fn paired(&self, metric: Metric, which: Figure, peer: &str) -> Option<f64> {
        self.paired_between(metric, which, "zklock", peer)
    }

    /// `ours`'s ratio to `theirs` on `which`, paired by round as [`paired`](Self::paired)
    /// pairs zklock's.
    pub(crate) fn paired_between(
        &self,
        metric: Metric,
        which: Figure,
        ours: &str,
        theirs: &str,
    ) -> Option<f64> {
        median(&self.ratios_between(metric, which, ours, theirs))
    }

    /// `ours`'s ratio to `theirs` on `which` in each round in which both ran, lowest first
    /// (for memory, `theirs` over `ours`).
    pub(crate) fn ratios_between(
        &self,
        metric: Metric,
        which: Figure,
        ours: &str,
        theirs: &str,
    ) -> Vec<f64> {
        let mut ratios: Vec<f64> = self
            .rounds
            .iter()
            .filter_map(|round| {
                let of = |column: &str| {
                    round
                        .get(column)
                        .and_then(|o| o.as_ref().ok())
                        .and_then(|r| figure_of(metric, which, r))
                        .filter(|v| *v > 0.0)
                };
                let (ours, theirs) = (of(ours)?, of(theirs)?);
                Some(match (which, metric) {
                    (Figure::Main, Metric::Memory) => theirs / ours,
                    _ => ours / theirs,
                })
            })
            .collect();
        ratios.sort_by(f64::total_cmp);
        ratios
    }
}

/// The median of `sorted` (lowest first): its middle figure, or the mean of its middle two;
/// none if it is empty.
pub(crate) fn median(sorted: &[f64]) -> Option<f64> {
    let mid = sorted.len() / 2;
    match sorted.len() {
        0 => None,
        n if n % 2 == 1 => Some(sorted[mid]),
        _ => Some((sorted[mid - 1] + sorted[mid]) / 2.0),
    }
}

/// The three rows of a replicated Redis deployment's section (Sentinel, Cluster), each run by
/// `cells` (made afresh per row): uncontended (target ≥ 1.1× rslock), contended on one key
/// (holder changes ≥ 1.5× rslock's: rslock's refused waiters sleep 0–200 ms, as in the Redis
/// section) and 8 workers over 64 keys (≥ 1.2× rslock).
pub(crate) fn rslock_rows(
    quick: bool,
    cells: impl Fn() -> Vec<(&'static str, Runner)>,
) -> Vec<Row> {
    let (uncontended, contended, keys) = if quick {
        (50, 5, 20)
    } else {
        (10_000, 500, 1_000)
    };
    let mut over_keys = Row::ops("keys (8 connections, 64 keys)", "keys", 8, keys, cells())
        .with_target(Target::Ratios(vec![Want::main("rslock", 1.2)]));
    over_keys.keys = 64;
    vec![
        Row::ops(
            "uncontended (1 connection, 1 key)",
            "uncontended",
            1,
            uncontended,
            cells(),
        )
        .with_target(Target::Ratios(vec![Want::main("rslock", 1.1)])),
        contended_against_rslock(contended, cells()),
        over_keys,
    ]
}

/// The contended row against rslock (8 connections on one key, `cycles` each). rslock's refused
/// waiters sleep 0–200 ms, so its releaser mostly takes the lock again: compared on how often
/// the lock changes hands, not on cycles.
pub(crate) fn contended_against_rslock(cycles: usize, cells: Vec<(&'static str, Runner)>) -> Row {
    Row::ops(
        "contended (8 connections, 1 key)",
        "contended",
        8,
        cycles,
        cells,
    )
    .with_target(Target::Ratios(vec![Want {
        peer: "rslock",
        figure: Figure::HolderChanges,
        ratio: 1.5,
    }]))
}
