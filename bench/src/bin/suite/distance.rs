//! `--rtt`: the suite at network distance. Every figure on loopback (a round trip of some
//! 50 µs) hides what a lock's round trips cost between machines; with `--rtt 1ms` each section
//! puts the test kit's [`Delay`] in front of every server's client port and gives every client,
//! zklock and its peers alike, the delayed address instead of the server's.
//!
//! The relays also count the round trips they carry: each run's count over its cycles is
//! added to its report line (`relay_round_trips_per_cycle`) and shown per row and peer under
//! the section's tables ([`table`]), measured on the wire rather than read from a server.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use zklock_bench::Report;
use zklock_testkit::Delay;

use crate::model::{Metric, Row, RowRuns};

/// The report field of the relays' round trips per cycle.
pub(crate) const FIELD: &str = "relay_round_trips_per_cycle";

/// Parses `--rtt`: a number and a unit, `ms`, `us` (or `µs`) or `s`, e.g. `1ms`, `500us`,
/// `0.5ms`, `2ms`.
pub(crate) fn parse_rtt(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("{text:?} has no unit: write e.g. 1ms, 500us or 2ms"))?;
    let (number, unit) = text.split_at(split);
    let number: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} does not start with a number: write e.g. 1ms or 500us"))?;
    let seconds = match unit.trim() {
        "ms" => number / 1e3,
        "us" | "µs" => number / 1e6,
        "s" => number,
        other => {
            return Err(format!(
                "{text:?}: unknown unit {other:?}; use ms, us or s (e.g. 1ms, 500us)"
            ))
        }
    };
    if !(seconds > 0.0 && seconds <= 10.0) {
        return Err(format!(
            "{text:?}: a round trip must be above 0 and at most 10 s"
        ));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// A round trip as a heading says it: `1 ms`, `500 µs`, `1.5 ms`.
pub(crate) fn label(rtt: Duration) -> String {
    let us = rtt.as_micros();
    if us < 1000 {
        format!("{us} µs")
    } else if us.is_multiple_of(1000) {
        format!("{} ms", us / 1000)
    } else {
        format!("{} ms", us as f64 / 1000.0)
    }
}

/// The distance a run's figures were taken at, in words: `loopback`, `1 ms round trip`.
pub(crate) fn phrase(rtt: Option<Duration>) -> String {
    rtt.map_or_else(
        || "loopback".into(),
        |rtt| format!("{} round trip", label(rtt)),
    )
}

/// A section's heading: its title and the distance it ran at (`Redis — 1 ms round trip`); on
/// loopback, or for a section that ignores `--rtt` (`distant: false`), what it ran at.
pub(crate) fn title(title: &str, rtt: Option<Duration>, distant: bool) -> String {
    match (rtt, distant) {
        (None, _) => title.to_string(),
        (Some(rtt), true) => format!("{title} — {}", phrase(Some(rtt))),
        (Some(_), false) => format!("{title} — loopback (`--rtt` does not apply here)"),
    }
}

/// What a section at distance says under its heading.
pub(crate) fn note(rtt: Duration) -> String {
    format!(
        "At {} round trip: every client (zklock and every peer) reaches the servers through \
         the test kit's `Delay`, a relay in front of each server's client port that delays \
         each direction by {} (bytes in order, a pipeline delayed once); the servers announce \
         the relays' addresses where they announce any (Sentinel, Cluster). The connection's \
         TCP handshake is not delayed.\n\n",
        label(rtt),
        label(rtt / 2)
    )
}

/// The relays of one section, or none on loopback.
#[derive(Default)]
pub(crate) struct Distance {
    rtt: Option<Duration>,
    delays: Vec<Delay>,
}

impl Distance {
    /// Relays adding `rtt` to each round trip (none: loopback, nothing in between).
    pub(crate) fn new(rtt: Option<Duration>) -> Distance {
        Distance {
            rtt,
            delays: vec![],
        }
    }

    /// Whether the section runs at a distance.
    pub(crate) fn is_far(&self) -> bool {
        self.rtt.is_some()
    }

    /// The address (`127.0.0.1:PORT`) that reaches `upstream` (`host:port`) at the distance:
    /// a new relay's, or `upstream` itself on loopback.
    pub(crate) fn front(&mut self, upstream: &str) -> Result<String, String> {
        let Some(rtt) = self.rtt else {
            return Ok(upstream.to_string());
        };
        let delay = Delay::start(upstream, rtt)
            .map_err(|e| format!("cannot start a delaying relay in front of {upstream}: {e}"))?;
        let addr = delay.addr().to_string();
        self.delays.push(delay);
        Ok(addr)
    }

    /// `url` (a URL or connect string naming one or more `127.0.0.1:PORT` or
    /// `localhost:PORT`) with each server's address replaced by a relay's in front of it.
    ///
    /// # Errors
    ///
    /// At a distance, when `url` names no such address (a server elsewhere, e.g. `--connect`
    /// to another host, which no relay of this machine would stand in front of).
    pub(crate) fn route(&mut self, url: &str) -> Result<String, String> {
        let found = endpoints(url);
        if self.is_far() && found.is_empty() {
            return Err(format!(
                "--rtt puts a relay in front of servers on this machine (127.0.0.1:PORT or \
                 localhost:PORT), and {url} names none: run without --rtt, or on a server of \
                 this machine"
            ));
        }
        let mut routed = String::with_capacity(url.len());
        let mut rest = 0;
        for (start, end) in found {
            routed.push_str(&url[rest..start]);
            routed.push_str(&self.front(&url[start..end])?);
            rest = end;
        }
        routed.push_str(&url[rest..]);
        Ok(routed)
    }

    /// The round trips every relay has carried so far.
    pub(crate) fn round_trips(&self) -> u64 {
        self.delays.iter().map(Delay::round_trips).sum()
    }

    /// Chunks the relays wrote late so far (see `DelayStats::late`).
    pub(crate) fn late(&self) -> u64 {
        self.delays.iter().map(|d| d.stats().late).sum()
    }

    /// How often the runner looks at a run (and samples the relays): every 10 ms at a
    /// distance, so that a timed window of a second is traced to 1%; else every 50 ms.
    pub(crate) fn poll(&self) -> Duration {
        Duration::from_millis(if self.is_far() { 10 } else { 50 })
    }

    /// Adds the relays' round trips so far, and when, to `trace` (at a distance).
    pub(crate) fn sample(&self, trace: &mut Trace) {
        if self.is_far() {
            trace.0.push((Instant::now(), self.round_trips()));
        }
    }

    /// Adds to a run's `report`, at a distance, the relays' round trips per cycle in the
    /// timed window ([`FIELD`]; see [`Trace::busiest`]), over the whole run
    /// (`relay_round_trips_per_cycle_whole_run`: connecting, warm-up and the server's
    /// statistics included), and the chunks they wrote late since `late_before`. Nothing on
    /// loopback or for a report with no cycles (the memory rows).
    pub(crate) fn record(&self, report: &mut Report, trace: &Trace, late_before: u64) {
        if !self.is_far() {
            return;
        }
        let cycles = report.number("cycles").or_else(|| report.number("waiters"));
        let Some(cycles) = cycles.filter(|c| *c > 0.0) else {
            return;
        };
        let window = report.number("secs").map(Duration::from_secs_f64);
        let whole = trace.whole();
        let windowed = window.and_then(|w| trace.busiest(w)).unwrap_or(whole);
        report.push(FIELD, format!("{:.2}", windowed / cycles));
        report.push(
            "relay_round_trips_per_cycle_whole_run",
            format!("{:.2}", whole / cycles),
        );
        report.push("relay_late_writes", self.late() - late_before);
    }
}

/// The relays' round trips counted so far, sampled while a run goes on.
#[derive(Default)]
pub(crate) struct Trace(Vec<(Instant, u64)>);

impl Trace {
    /// The round trips from the first sample to the last: the whole run.
    fn whole(&self) -> f64 {
        match (self.0.first(), self.0.last()) {
            (Some(first), Some(last)) => (last.1 - first.1) as f64,
            _ => 0.0,
        }
    }

    /// The round trips in the run's busiest stretch as long as `window`, its timed window: a
    /// run connects, warms up on a key of its own (one worker, uncontended) and reads the
    /// server's statistics outside its window, and none of that is the row's cycle. Each
    /// stretch runs from one sample to the first at least `window` later, its count scaled
    /// down to `window`. `None` when the window is too short to trace (under 5 samples).
    fn busiest(&self, window: Duration) -> Option<f64> {
        let samples = &self.0;
        let step = samples.windows(2).map(|w| w[1].0 - w[0].0).min()?;
        if window < step * 5 {
            return None;
        }
        let mut best: Option<f64> = None;
        let mut j = 0;
        for (i, &(t0, n0)) in samples.iter().enumerate() {
            j = j.max(i);
            while j < samples.len() && samples[j].0 - t0 < window {
                j += 1;
            }
            let Some(&(t1, n1)) = samples.get(j) else {
                break;
            };
            let scaled = (n1 - n0) as f64 * window.as_secs_f64() / (t1 - t0).as_secs_f64();
            best = Some(best.map_or(scaled, |b: f64| b.max(scaled)));
        }
        best
    }
}

/// The spans of `127.0.0.1:PORT` and `localhost:PORT` in `url`, in order.
fn endpoints(url: &str) -> Vec<(usize, usize)> {
    let mut found = vec![];
    let mut from = 0;
    while let Some((start, host)) = ["127.0.0.1:", "localhost:"]
        .iter()
        .filter_map(|h| url[from..].find(h).map(|at| (from + at, h.len())))
        .min()
    {
        let digits = url[start + host..]
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(url.len() - start - host);
        let end = start + host + digits;
        if digits > 0 {
            found.push((start, end));
        }
        from = end;
    }
    found
}

/// The table of the relays' round trips per cycle, by row and peer (each cell's median run;
/// not the memory rows), for a section at a distance; empty on loopback.
pub(crate) fn table(distance: &Distance, rows: &[Row], results: &[RowRuns]) -> String {
    if !distance.is_far() {
        return String::new();
    }
    let mut columns: Vec<&str> = vec![];
    for row in rows {
        for (column, _) in &row.cells {
            if !columns.contains(column) {
                columns.push(column);
            }
        }
    }
    let mut md = String::from(
        "\nRound trips per cycle, measured at the relays: the round trips that crossed the \
         distance (on each connection, every client write after the server's last write reached \
         the client), over its cycles (drain: its waiters), in the run's busiest stretch as long \
         as its timed window (the relays sampled every 10 ms: connecting, the warm-up and the \
         server's statistics left out; each line below also gives the whole run's figure, \
         `relay_round_trips_per_cycle_whole_run`). Each cell is that of the median run above.\n\n| workload |",
    );
    for column in &columns {
        let _ = write!(md, " {column} |");
    }
    md.push_str("\n| --- |");
    md.push_str(&" ---: |".repeat(columns.len()));
    md.push('\n');
    // A memory row has no cycles: its figure is the memory of waiters.
    let cycled = rows
        .iter()
        .zip(results)
        .filter(|(r, _)| r.metric != Metric::Memory);
    for (row, runs) in cycled {
        let _ = write!(md, "| {} |", row.title);
        for column in &columns {
            let text = match runs.kept.get(column) {
                Some(Ok(report)) => report.get(FIELD).unwrap_or("?").to_string(),
                Some(Err(_)) => "—".into(),
                None => "n/a".into(),
            };
            let _ = write!(md, " {text} |");
        }
        md.push('\n');
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_round_trips_in_their_units() {
        assert_eq!(parse_rtt("1ms"), Ok(Duration::from_millis(1)));
        assert_eq!(parse_rtt("500us"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_rtt("500µs"), Ok(Duration::from_micros(500)));
        assert_eq!(parse_rtt("2ms"), Ok(Duration::from_millis(2)));
        assert_eq!(parse_rtt("0.5ms"), Ok(Duration::from_micros(500)));
        assert!(parse_rtt("1").unwrap_err().contains("no unit"));
        assert!(parse_rtt("1min").unwrap_err().contains("unknown unit"));
        assert!(parse_rtt("0ms").is_err());
    }

    #[test]
    fn labels_and_titles_say_the_distance() {
        assert_eq!(label(Duration::from_millis(1)), "1 ms");
        assert_eq!(label(Duration::from_micros(500)), "500 µs");
        assert_eq!(label(Duration::from_micros(1500)), "1.5 ms");
        let rtt = Some(Duration::from_millis(1));
        assert_eq!(title("Redis", rtt, true), "Redis — 1 ms round trip");
        assert_eq!(title("Redis", None, true), "Redis");
        assert_eq!(phrase(rtt), "1 ms round trip");
        assert_eq!(phrase(None), "loopback");
        assert!(title("TLS", rtt, false).contains("loopback"));
    }

    #[test]
    fn the_busiest_stretch_is_the_timed_window() {
        let t = Instant::now();
        let ms = |m: u64| t + Duration::from_millis(m);
        // Connecting and a slow warm-up (1 per 10 ms), then a window of 100 ms at 10 per 10
        // ms, then the statistics.
        let mut samples = vec![];
        let mut n = 0;
        for step in 0..=40u64 {
            samples.push((ms(step * 10), n));
            n += if (20..30).contains(&step) { 10 } else { 1 };
        }
        let trace = Trace(samples);
        assert_eq!(trace.whole(), 130.0);
        assert_eq!(trace.busiest(Duration::from_millis(100)), Some(100.0));
        // Too short a window to trace.
        assert_eq!(trace.busiest(Duration::from_millis(20)), None);
    }

    #[test]
    fn routes_each_endpoint_of_a_url() {
        let url = "etcd://127.0.0.1:2379,localhost:23790/x";
        assert_eq!(endpoints(url), vec![(7, 21), (22, 37)]);
        // On loopback, nothing in between.
        assert_eq!(Distance::new(None).route(url).unwrap(), url);
        assert_eq!(endpoints("redis://h:1/"), vec![]);
    }
}
