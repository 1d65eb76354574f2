//! The output line shared with the peers' benches: `key=value` fields separated by spaces.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

/// One benchmark's output line, e.g.
/// `peer=zklock workload=contended workers=8 cycles=4000 secs=1.234 ops_per_s=3241.5 p50_us=2300 p99_us=5100 violations=0`.
///
/// Fields keep their order; the first ones are exactly those of the test kit's `peers/run`, extra
/// figures (requests per cycle, watch events per release, RSS) follow.
///
/// # Examples
///
/// ```
/// let mut r = zklock_bench::Report::new();
/// r.push("peer", "zklock");
/// r.push("secs", format!("{:.3}", 1.5));
/// assert_eq!(r.to_string(), "peer=zklock secs=1.500");
/// assert_eq!(r.get("secs"), Some("1.500"));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    fields: Vec<(String, String)>,
}

impl Report {
    /// An empty line.
    ///
    /// ```
    /// assert_eq!(zklock_bench::Report::new().to_string(), "");
    /// ```
    pub fn new() -> Report {
        Report::default()
    }

    /// Appends a field (replacing an earlier one of the same name).
    ///
    /// ```
    /// let mut r = zklock_bench::Report::new();
    /// r.push("a", 1);
    /// r.push("a", 2);
    /// assert_eq!(r.to_string(), "a=2");
    /// ```
    pub fn push(&mut self, key: &str, value: impl fmt::Display) {
        let value = value.to_string();
        match self.fields.iter_mut().find(|(k, _)| k == key) {
            Some(field) => field.1 = value,
            None => self.fields.push((key.to_string(), value)),
        }
    }

    /// The value of a field.
    ///
    /// ```
    /// let r = zklock_bench::parse_line("peer=floor ops_per_s=10.0").unwrap();
    /// assert_eq!(r.get("ops_per_s"), Some("10.0"));
    /// ```
    pub fn get(&self, key: &str) -> Option<&str> {
        self.fields
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The value of a field as a number.
    ///
    /// ```
    /// let r = zklock_bench::parse_line("peer=floor ops_per_s=10.5").unwrap();
    /// assert_eq!(r.number("ops_per_s"), Some(10.5));
    /// ```
    pub fn number(&self, key: &str) -> Option<f64> {
        self.get(key).and_then(|v| v.parse().ok())
    }

    /// Every field as a map.
    ///
    /// ```
    /// let r = zklock_bench::parse_line("peer=x a=1").unwrap();
    /// assert_eq!(r.to_map().len(), 2);
    /// ```
    pub fn to_map(&self) -> BTreeMap<String, String> {
        self.fields.iter().cloned().collect()
    }

    /// Adds the throughput and latency fields of the peers' line for `n` cycles in `elapsed`.
    pub(crate) fn push_ops(&mut self, elapsed: Duration, latencies_ns: &mut [u64]) {
        let n = latencies_ns.len();
        let secs = elapsed.as_secs_f64();
        latencies_ns.sort_unstable();
        let pct = |q: f64| -> u64 {
            if n == 0 {
                return 0;
            }
            latencies_ns[((n as f64 * q) as usize).min(n - 1)] / 1000
        };
        self.push("cycles", n);
        self.push("secs", format!("{secs:.3}"));
        self.push("ops_per_s", format!("{:.1}", n as f64 / secs.max(1e-9)));
        self.push("p50_us", pct(0.5));
        self.push("p99_us", pct(0.99));
    }

    /// Adds what a contended run's fairness shows beside its throughput: how often the key
    /// changed hands per second (`holder_changes_per_s`), and the longest acquire, from the
    /// call to the grant (`max_wait_us`). A lock whose waiters sleep and let the releaser take
    /// it again runs fast with few changes and a long longest wait.
    pub(crate) fn push_contention(&mut self, elapsed: Duration, changes: u64, max_wait_ns: u64) {
        let secs = elapsed.as_secs_f64().max(1e-9);
        self.push(
            "holder_changes_per_s",
            format!("{:.1}", changes as f64 / secs),
        );
        self.push("max_wait_us", max_wait_ns / 1000);
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (k, v)) in self.fields.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{k}={v}")?;
        }
        Ok(())
    }
}

/// Parses an output line (zklock-bench's, CuratorBench's or kazoo_bench's); `None` when the line
/// is not one (it must start with `peer=`).
///
/// # Examples
///
/// ```
/// let line = "peer=curator workload=contended workers=8 cycles=800 secs=1.000 ops_per_s=800.0 p50_us=9000 p99_us=20000 violations=0";
/// let r = zklock_bench::parse_line(line).unwrap();
/// assert_eq!(r.get("peer"), Some("curator"));
/// assert_eq!(r.number("violations"), Some(0.0));
/// assert!(zklock_bench::parse_line("SLF4J: no binding").is_none());
/// ```
pub fn parse_line(line: &str) -> Option<Report> {
    let line = line.trim();
    if !line.starts_with("peer=") {
        return None;
    }
    let mut report = Report::new();
    for field in line.split_whitespace() {
        let (k, v) = field.split_once('=')?;
        report.push(k, v);
    }
    Some(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_fields_follow_the_peers_format() {
        let mut r = Report::new();
        r.push("peer", "zklock");
        r.push("workload", "contended");
        r.push("workers", 2);
        let mut lat: Vec<u64> = (1..=100).rev().map(|i| i * 1000).collect();
        r.push_ops(Duration::from_secs(2), &mut lat);
        assert_eq!(
            r.to_string(),
            "peer=zklock workload=contended workers=2 cycles=100 secs=2.000 ops_per_s=50.0 p50_us=51 p99_us=100"
        );
        assert_eq!(parse_line(&r.to_string()), Some(r.clone()));
        r.push_contention(Duration::from_secs(2), 50, 7_500_000);
        assert_eq!(r.get("holder_changes_per_s"), Some("25.0"));
        assert_eq!(r.get("max_wait_us"), Some("7500"));
    }
}
