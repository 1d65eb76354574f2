//! The demo's tables and its machine-readable lines.

use std::fmt::Write as _;
use std::time::Duration;

use crate::driver::{DemoResults, Mode};
use crate::service::Outcome;

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

    /// `inventory: mode=lock initial=N sold=N left=N oversold=N orders=N instances=N`.
    pub fn machine_line(&self) -> String {
        format!(
            "inventory: mode={} initial={} sold={} left={} oversold={} orders={} instances={}",
            self.mode.name(),
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
    /// The SKU (stock 1).
    pub sku: String,
    /// The session timeout the instances asked for.
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

    /// `inventory-pause: stale_write=rejected ...`.
    pub fn machine_line(&self) -> String {
        format!(
            "inventory-pause: stale_write={} paused_ms={} session_timeout_ms={} stale_token={} winner_token={} sold={} left={} oversold={}",
            if self.stale_rejected() { "rejected" } else { outcome_name(self.stale_outcome) },
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

/// One cell of a mode's column.
type Cell = fn(&ModeReport) -> String;

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

/// The tables: one column per mode, then the pause scenario; then the machine-readable lines,
/// the `lock` mode's last.
pub fn render(results: &DemoResults) -> String {
    let mut out = String::new();
    if !results.modes.is_empty() {
        let rows: Vec<(&str, Cell)> = vec![
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
        ];
        let width = 16;
        let _ = write!(out, "\n{:<22}", "");
        for r in &results.modes {
            let _ = write!(out, "{:>width$}", r.mode.title());
        }
        let _ = writeln!(out);
        let _ = writeln!(out, "{}", "-".repeat(22 + width * results.modes.len()));
        for (name, cell) in &rows {
            let _ = write!(out, "{name:<22}");
            for r in &results.modes {
                let _ = write!(out, "{:>width$}", cell(r));
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
    if let Some(p) = &results.pause {
        let _ = writeln!(
            out,
            "\npause scenario (with lock, sku {}, stock {}, session timeout {:?})",
            p.sku, p.initial, p.session_timeout
        );
        let _ = writeln!(out, "{}", "-".repeat(86));
        let _ = writeln!(
            out,
            "{:<10}{:<44}{:>14}  result",
            "instance", "step", "token"
        );
        let _ = writeln!(
            out,
            "{:<10}{:<44}{:>14}  frozen {:.1} s",
            p.holder,
            "took the lock, read stock, SIGSTOP",
            p.holder_token,
            p.paused_for.as_secs_f64()
        );
        let _ = writeln!(
            out,
            "{:<10}{:<44}{:>14}  {}",
            p.taker,
            "took over once the session expired",
            p.taker_token,
            outcome_name(p.taker_outcome)
        );
        let stale_result = match (p.stale_outcome, &p.store_token) {
            (Outcome::Fenced, Some(last)) => format!("REJECTED by the fence (store has {last})"),
            (o, _) => match &p.stale_error {
                Some(e) => format!("{} ({e})", outcome_name(o)),
                None => outcome_name(o).to_string(),
            },
        };
        let _ = writeln!(
            out,
            "{:<10}{:<44}{:>14}  {}",
            p.holder,
            format!(
                "SIGCONT, wrote stock {} - 1",
                p.stale_stock_read
                    .map(|s| s.to_string())
                    .unwrap_or_else(|| "?".into())
            ),
            p.holder_token,
            stale_result
        );
        let _ = writeln!(
            out,
            "sold {} of {}, left {}, oversold {}, stale writes rejected {}",
            p.sold,
            p.initial,
            p.left,
            p.oversold,
            u32::from(p.stale_rejected())
        );
    }
    let _ = writeln!(out);
    for r in results.modes.iter().filter(|r| r.mode != Mode::Lock) {
        let _ = writeln!(out, "{}", r.machine_line());
    }
    if let Some(p) = &results.pause {
        let _ = writeln!(out, "{}", p.machine_line());
    }
    for r in results.modes.iter().filter(|r| r.mode == Mode::Lock) {
        let _ = writeln!(out, "{}", r.machine_line());
    }
    out
}
