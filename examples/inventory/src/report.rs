//! The demo's tables and its machine-readable lines.

use std::fmt::Write as _;
use std::time::Duration;

use crate::backends::LockBackend;
use crate::backends::Mode;
use crate::scrape::LockMetrics;
use crate::service::Outcome;

/// Everything the demo measured.
#[derive(Debug, Clone)]
pub struct DemoResults {
    /// One report per mode, in the order run.
    pub modes: Vec<ModeReport>,
    /// The pause scenario, once per lock backend, if run.
    pub pauses: Vec<PauseReport>,
}

/// What one mode's run measured. `sold`, `left` and `oversold` come from the store itself;
/// the other counts from the answers the clients got.
#[derive(Debug, Clone)]
pub struct ModeReport {
    /// The mode.
    pub mode: Mode,
    /// Instances (processes) of the service.
    pub instances: u32,
    /// Stock before the run, over all SKUs.
    pub initial: i64,
    /// Orders placed.
    pub orders: u64,
    /// Orders recorded as sold in the store.
    pub sold: i64,
    /// Stock left in the store.
    pub left: i64,
    /// Units sold beyond a SKU's stock, summed over SKUs.
    pub oversold: i64,
    /// Orders answered "sold".
    pub answered_sold: u64,
    /// Orders answered "out of stock".
    pub rejected: u64,
    /// Orders whose write the store refused as stale.
    pub fenced: u64,
    /// Orders that failed (transport, lock or store errors).
    pub errors: u64,
    /// Wall time of the load.
    pub secs: f64,
    /// Median latency seen by the clients.
    pub p50: Duration,
    /// 99th percentile latency seen by the clients.
    pub p99: Duration,
    /// zklock's own metrics, scraped from the instances' `/metrics` (modes with a lock).
    pub lock_metrics: Option<LockMetrics>,
    /// The failover in the middle of the orders (Redis under Sentinel only).
    pub failover: Option<FailoverReport>,
}

/// What the failover in the middle of a run did (Redis under Sentinel): `SENTINEL FAILOVER`
/// sent once a quarter of the stock was ordered, while the orders kept flowing.
#[derive(Debug, Clone)]
pub struct FailoverReport {
    /// The primary before and after (`host:port`).
    pub old_primary: String,
    /// The primary after.
    pub new_primary: String,
    /// When it was sent, from the start of the load.
    pub at: Duration,
    /// From `SENTINEL FAILOVER` until every Sentinel named the new primary and it said so
    /// (`ROLE`).
    pub took: Duration,
    /// The longest an order waited for its answer among those answered after the failover
    /// began: how long orders stalled.
    pub stall: Duration,
    /// The longest an order waited for its answer before the failover began, for comparison.
    pub longest_before: Duration,
    /// Orders answered "sold" once the new primary was named.
    pub sold_after: u64,
    /// The pace of the orders (orders/s) that kept them flowing across the failover.
    pub paced: f64,
}

impl ModeReport {
    /// Orders per second.
    pub fn rate(&self) -> f64 {
        if self.secs > 0.0 {
            self.orders as f64 / self.secs
        } else {
            0.0
        }
    }

    /// `inventory-metrics: backend=zk acquires_ok=N acquires_timeout=N acquires_error=N
    /// holds_lost=N local_handoffs=N backend_grants=N wait_p99_le_ms=X`: zklock's own metrics
    /// as the instances' `/metrics` reported them (modes with a lock only).
    pub fn metrics_line(&self) -> Option<String> {
        let m = self.lock_metrics.as_ref()?;
        let backend = self.mode.backend()?;
        Some(format!(
            "inventory-metrics: backend={} acquires_ok={} acquires_timeout={} acquires_error={} holds_lost={} local_handoffs={} backend_grants={} wait_p99_le_ms={}",
            backend.name(),
            m.acquires_ok,
            m.acquires_timeout,
            m.acquires_error,
            m.holds_lost,
            m.local_handoffs,
            m.backend_grants,
            m.wait_quantile(0.99)
                .map_or_else(|| "-".to_string(), |le| (le * 1000.0).to_string()),
        ))
    }

    /// `inventory: mode=lock backend=zk initial=N sold=N left=N oversold=N orders=N
    /// instances=N` (no `backend=` for `mode=nolock`); a run with a failover adds `fenced=N
    /// holds_lost_failover=N failovers_seen=N failover_ms=N stall_ms=N sold_after=N`.
    pub fn machine_line(&self) -> String {
        let failover = self
            .failover
            .as_ref()
            .map(|f| {
                let m = self.lock_metrics.clone().unwrap_or_default();
                format!(
                    " fenced={} holds_lost_failover={} failovers_seen={} failover_ms={} stall_ms={} sold_after={}",
                    self.fenced,
                    m.holds_lost_failover,
                    m.failovers,
                    f.took.as_millis(),
                    f.stall.as_millis(),
                    f.sold_after
                )
            })
            .unwrap_or_default();
        format!(
            "inventory: mode={}{} initial={} sold={} left={} oversold={} orders={} instances={}{failover}",
            self.mode.name(),
            self.mode
                .backend()
                .map(|b| format!(" backend={}", b.name()))
                .unwrap_or_default(),
            self.initial,
            self.sold,
            self.left,
            self.oversold,
            self.orders,
            self.instances
        )
    }
}

/// What the pause scenario saw.
#[derive(Debug, Clone)]
pub struct PauseReport {
    /// The lock backend it ran on.
    pub backend: LockBackend,
    /// The SKU (stock 1).
    pub sku: String,
    /// The session timeout (ZooKeeper) or lease (Redis, PostgreSQL) the instances asked for.
    pub session_timeout: Duration,
    /// The instance frozen while holding the lock.
    pub holder: u32,
    /// Its fencing token.
    pub holder_token: String,
    /// How long it stayed frozen (until the other instance had sold).
    pub paused_for: Duration,
    /// The instance that took over.
    pub taker: u32,
    /// What the taker's order did.
    pub taker_outcome: Outcome,
    /// The taker's fencing token.
    pub taker_token: String,
    /// What the thawed holder's write did.
    pub stale_outcome: Outcome,
    /// The stock the holder had read before it was frozen.
    pub stale_stock_read: Option<i64>,
    /// The token the store had accepted when it refused the holder's.
    pub store_token: Option<String>,
    /// The holder's error, if its order failed instead.
    pub stale_error: Option<String>,
    /// Stock before (1).
    pub initial: i64,
    /// Orders recorded as sold.
    pub sold: i64,
    /// Stock left.
    pub left: i64,
    /// Sold beyond stock.
    pub oversold: i64,
}

impl PauseReport {
    /// Whether the stale write was refused by the fence.
    pub fn stale_rejected(&self) -> bool {
        self.stale_outcome == Outcome::Fenced
    }

    /// Whether the next holder got the lock (and sold) while the holder was frozen.
    pub fn next_holder_got_in(&self) -> bool {
        self.taker_outcome == Outcome::Sold
    }

    /// `inventory-pause: backend=zk stale_write=rejected ...`.
    pub fn machine_line(&self) -> String {
        format!(
            "inventory-pause: backend={} stale_write={} next_holder={} paused_ms={} session_timeout_ms={} stale_token={} winner_token={} sold={} left={} oversold={}",
            self.backend.name(),
            if self.stale_rejected() { "rejected" } else { outcome_name(self.stale_outcome) },
            outcome_name(self.taker_outcome),
            self.paused_for.as_millis(),
            self.session_timeout.as_millis(),
            self.holder_token,
            self.taker_token,
            self.sold,
            self.left,
            self.oversold
        )
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Sold => "sold",
        Outcome::OutOfStock => "out_of_stock",
        Outcome::Fenced => "rejected",
        Outcome::UnknownSku => "unknown_sku",
        Outcome::Error => "error",
    }
}

/// A row of the load's figures: its name and how a mode's report fills its cell.
type LoadRow = (&'static str, fn(&ModeReport) -> String);

/// A cell from zklock's scraped metrics, `-` for a mode without them.
fn metric(r: &ModeReport, cell: impl Fn(&LockMetrics) -> String) -> String {
    r.lock_metrics
        .as_ref()
        .map_or_else(|| "-".to_string(), cell)
}

/// A row of the pause scenario: its name and how a pause report fills its cell.
type PauseRow = (&'static str, fn(&PauseReport) -> String);

/// One row of the table: its name and the cell of each mode's column.
struct Row {
    name: &'static str,
    cells: Vec<String>,
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The rows of the pause scenario, a cell per mode (`-` where it did not run).
fn pause_rows(results: &DemoResults) -> Vec<Row> {
    let pause_of = |mode: Mode| {
        mode.backend()
            .and_then(|b| results.pauses.iter().find(|p| p.backend == b))
    };
    let rows: [PauseRow; 6] = [
        ("pause: holder frozen", |p| {
            format!("{:.1} s", p.paused_for.as_secs_f64())
        }),
        ("pause: next holder", |p| {
            if p.next_holder_got_in() {
                format!("got in, {:.1} s", p.paused_for.as_secs_f64())
            } else {
                outcome_name(p.taker_outcome).to_string()
            }
        }),
        ("pause: stale token", |p| p.holder_token.clone()),
        ("pause: next token", |p| p.taker_token.clone()),
        ("pause: stale write", |p| {
            if p.stale_rejected() {
                "REJECTED by fence".to_string()
            } else {
                match &p.stale_error {
                    Some(_) => format!("{} (error)", outcome_name(p.stale_outcome)),
                    None => outcome_name(p.stale_outcome).to_string(),
                }
            }
        }),
        ("pause: oversold", |p| p.oversold.to_string()),
    ];
    rows.into_iter()
        .map(|(name, cell)| Row {
            name,
            cells: results
                .modes
                .iter()
                .map(|r| pause_of(r.mode).map_or_else(|| "-".to_string(), cell))
                .collect(),
        })
        .collect()
}

/// A row of the failover: its name and how a mode's report and its failover fill its cell.
type FailoverRow = (&'static str, fn(&ModeReport, &FailoverReport) -> String);

/// The rows of the failover in the middle of the orders, a cell per mode (`-` where there
/// was none).
fn failover_rows(results: &DemoResults) -> Vec<Row> {
    let rows: [FailoverRow; 6] = [
        ("failover: sent at", |_, f| {
            format!("{:.1} s", f.at.as_secs_f64())
        }),
        ("failover: took", |_, f| {
            format!("{:.1} s", f.took.as_secs_f64())
        }),
        ("failover: holds lost", |r, _| {
            metric(r, |m| m.holds_lost_failover.to_string())
        }),
        ("failover: orders stall", |_, f| {
            format!("{:.2} s", f.stall.as_secs_f64())
        }),
        ("failover: sold after", |_, f| f.sold_after.to_string()),
        ("failover: paced at", |_, f| format!("{:.0}/s", f.paced)),
    ];
    rows.into_iter()
        .map(|(name, cell)| Row {
            name,
            cells: results
                .modes
                .iter()
                .map(|r| {
                    r.failover
                        .as_ref()
                        .map_or_else(|| "-".to_string(), |f| cell(r, f))
                })
                .collect(),
        })
        .collect()
}

/// The comparison table (one column per mode: without lock, then the lock on each backend;
/// the load's figures, then the pause scenario's), its notes, and then the machine-readable
/// lines: the `nolock` mode's, the pause scenario's, and last the `lock` modes', one per
/// backend.
pub fn render(results: &DemoResults) -> String {
    let mut out = String::new();
    if !results.modes.is_empty() {
        let load: [LoadRow; 16] = [
            ("instances", |r| r.instances.to_string()),
            ("initial stock", |r| r.initial.to_string()),
            ("orders placed", |r| r.orders.to_string()),
            ("sold", |r| r.sold.to_string()),
            ("left", |r| r.left.to_string()),
            ("oversold", |r| r.oversold.to_string()),
            ("rejected (no stock)", |r| r.rejected.to_string()),
            ("fenced (stale write)", |r| r.fenced.to_string()),
            ("errors", |r| r.errors.to_string()),
            ("orders/s", |r| format!("{:.0}", r.rate())),
            ("latency p50", |r| ms(r.p50)),
            ("latency p99", |r| ms(r.p99)),
            ("zklock: acquires", |r| {
                metric(r, |m| {
                    format!("{} ok, {} t/o", m.acquires_ok, m.acquires_timeout)
                })
            }),
            ("zklock: wait p99", |r| {
                metric(r, |m| match m.wait_quantile(0.99) {
                    Some(le) if le.is_finite() => format!("<= {} ms", le * 1000.0),
                    Some(_) => "> last bucket".into(),
                    None => "-".into(),
                })
            }),
            ("zklock: holds lost", |r| {
                metric(r, |m| m.holds_lost.to_string())
            }),
            ("zklock: local/backend", |r| {
                metric(r, |m| {
                    format!("{} / {}", m.local_handoffs, m.backend_grants)
                })
            }),
        ];
        let mut rows: Vec<Row> = load
            .into_iter()
            .map(|(name, cell)| Row {
                name,
                cells: results.modes.iter().map(cell).collect(),
            })
            .collect();
        if results.modes.iter().any(|r| r.failover.is_some()) {
            rows.extend(failover_rows(results));
        }
        if !results.pauses.is_empty() {
            rows.extend(pause_rows(results));
        }
        let label = 22;
        let width = results
            .modes
            .iter()
            .map(|r| r.mode.title().len())
            .chain(rows.iter().flat_map(|r| r.cells.iter().map(String::len)))
            .max()
            .unwrap_or(0)
            + 2;
        let _ = write!(out, "\n{:<label$}", "");
        for r in &results.modes {
            let _ = write!(out, "{:>width$}", r.mode.title());
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "{}", "-".repeat(label + width * results.modes.len()));
        for row in &rows {
            let _ = write!(out, "{:<label$}", row.name);
            for cell in &row.cells {
                let _ = write!(out, "{cell:>width$}");
            }
            let _ = writeln!(out);
        }
        for r in &results.modes {
            if r.mode == Mode::NoLock && r.oversold > 0 {
                let _ = writeln!(
                    out,
                    "\nwithout lock: {} units sold that did not exist (two instances read the same stock, both sold)",
                    r.oversold
                );
            }
            if let (Some(f), Some(m)) = (&r.failover, &r.lock_metrics) {
                let _ = writeln!(
                    out,
                    "\n{}: SENTINEL FAILOVER at {:.1} s into the orders ({} -> {}), while orders flowed \
                     (paced at {:.0}/s); the Sentinels named the new primary after {:.1} s.\n\
                     {} holds were lost to the failover (LossReason::Failover, {} of {} instances saw it); \
                     orders stalled up to {:.2} s (the longest order answered after the failover began; \
                     before it, {:.2} s); {} sold on the new primary; {} stale writes refused by the \
                     fence; oversold {}.",
                    r.mode.title(),
                    f.at.as_secs_f64(),
                    f.old_primary,
                    f.new_primary,
                    f.paced,
                    f.took.as_secs_f64(),
                    m.holds_lost_failover,
                    m.failovers,
                    r.instances,
                    f.stall.as_secs_f64(),
                    f.longest_before.as_secs_f64(),
                    f.sold_after,
                    r.fenced,
                    r.oversold
                );
            }
            if r.sold != r.answered_sold as i64 {
                let _ = writeln!(
                    out,
                    "note ({}): the store recorded {} sales, the clients were answered {}",
                    r.mode.title(),
                    r.sold,
                    r.answered_sold
                );
            }
        }
    }
    if let Some(p) = results.pauses.first() {
        let _ = writeln!(
            out,
            "\npause scenario (per backend, sku {}, stock {}): instance {} takes the lock, reads the stock and is frozen",
            p.sku, p.initial, p.holder
        );
        let _ = writeln!(
            out,
            "(SIGSTOP) past its session timeout or lease ({:?}); instance {} orders the same sku; then instance {} is thawed",
            p.session_timeout, p.taker, p.holder
        );
        let _ = writeln!(
            out,
            "(SIGCONT) and writes the stock it read less one, with its old fencing token."
        );
        for p in &results.pauses {
            if let (Outcome::Fenced, Some(last)) = (p.stale_outcome, &p.store_token) {
                let _ = writeln!(
                    out,
                    "{}: the stale write (stock {} - 1, token {}) was REJECTED by the fence: the store had token {last}",
                    p.backend,
                    p.stale_stock_read
                        .map(|s| s.to_string())
                        .unwrap_or_else(|| "?".into()),
                    p.holder_token
                );
            } else if let Some(e) = &p.stale_error {
                let _ = writeln!(out, "{}: the stale order failed: {e}", p.backend);
            }
        }
    }
    let _ = writeln!(out);
    for r in results.modes.iter().filter(|r| r.mode == Mode::NoLock) {
        let _ = writeln!(out, "{}", r.machine_line());
    }
    for r in &results.modes {
        if let Some(line) = r.metrics_line() {
            let _ = writeln!(out, "{line}");
        }
    }
    for p in &results.pauses {
        let _ = writeln!(out, "{}", p.machine_line());
    }
    for r in results.modes.iter().filter(|r| r.mode != Mode::NoLock) {
        let _ = writeln!(out, "{}", r.machine_line());
    }
    out
}
