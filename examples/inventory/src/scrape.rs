//! What the instances' `/metrics` say about their locks: zklock's own metrics (see
//! `zklock::metrics`), scraped after a run and summed over the instances.

/// zklock's figures of one run, summed over the instances.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LockMetrics {
    /// `zklock_acquires_total{outcome="ok"}`.
    pub acquires_ok: f64,
    /// `zklock_acquires_total{outcome="timeout"}`.
    pub acquires_timeout: f64,
    /// `zklock_acquires_total{outcome="error"}`.
    pub acquires_error: f64,
    /// `zklock_holds_lost_total`, every reason.
    pub holds_lost: f64,
    /// `zklock_holds_lost_total{reason="failover"}`: holds the store's failover to a new
    /// primary ended (Redis under Sentinel).
    pub holds_lost_failover: f64,
    /// `zklock_failovers_total`: failovers the instances saw (each instance counts its own).
    pub failovers: f64,
    /// `zklock_local_handoffs_total`: grants passed between tasks of one instance.
    pub local_handoffs: f64,
    /// `zklock_backend_grants_total`: grants that took the backend's round trips.
    pub backend_grants: f64,
    /// `zklock_acquire_wait_seconds`: cumulative bucket counts, by upper bound (seconds).
    pub wait_buckets: Vec<(f64, f64)>,
    /// `zklock_acquire_wait_seconds_count`.
    pub waits: f64,
}

impl LockMetrics {
    /// Adds one scrape (the Prometheus text format) to the sums.
    ///
    /// ```
    /// use zklock_inventory::scrape::LockMetrics;
    /// let mut m = LockMetrics::default();
    /// m.add_scrape(concat!(
    ///     "# TYPE zklock_acquires_total counter\n",
    ///     "zklock_acquires_total{recipe=\"mutex\",backend=\"zookeeper\",outcome=\"ok\"} 7\n",
    ///     "zklock_acquire_wait_seconds_bucket{recipe=\"mutex\",backend=\"zookeeper\",le=\"0.01\"} 6\n",
    ///     "zklock_acquire_wait_seconds_bucket{recipe=\"mutex\",backend=\"zookeeper\",le=\"+Inf\"} 7\n",
    ///     "zklock_acquire_wait_seconds_count{recipe=\"mutex\",backend=\"zookeeper\"} 7\n",
    /// ));
    /// assert_eq!(m.acquires_ok, 7.0);
    /// m.add_scrape(concat!(
    ///     "zklock_holds_lost_total{recipe=\"mutex\",backend=\"redis\",reason=\"failover\"} 3\n",
    ///     "zklock_holds_lost_total{recipe=\"mutex\",backend=\"redis\",reason=\"lease_expired\"} 1\n",
    ///     "zklock_failovers_total{backend=\"redis\"} 1\n",
    /// ));
    /// assert_eq!((m.holds_lost, m.holds_lost_failover, m.failovers), (4.0, 3.0, 1.0));
    /// assert_eq!(m.wait_quantile(0.5), Some(0.01));
    /// assert_eq!(m.wait_quantile(0.99), Some(f64::INFINITY));
    /// ```
    pub fn add_scrape(&mut self, text: &str) {
        for line in text.lines() {
            if line.starts_with('#') || line.trim().is_empty() {
                continue;
            }
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let (name, labels) = match series.split_once('{') {
                Some((name, labels)) => (name, labels.trim_end_matches('}')),
                None => (series, ""),
            };
            let label = |key: &str| {
                labels.split(',').find_map(|kv| {
                    let (k, v) = kv.split_once('=')?;
                    (k == key).then(|| v.trim_matches('"'))
                })
            };
            match name {
                "zklock_acquires_total" => match label("outcome") {
                    Some("ok") => self.acquires_ok += value,
                    Some("timeout") => self.acquires_timeout += value,
                    Some("error") => self.acquires_error += value,
                    _ => {}
                },
                "zklock_holds_lost_total" => {
                    self.holds_lost += value;
                    if label("reason") == Some("failover") {
                        self.holds_lost_failover += value;
                    }
                }
                "zklock_failovers_total" => self.failovers += value,
                "zklock_local_handoffs_total" => self.local_handoffs += value,
                "zklock_backend_grants_total" => self.backend_grants += value,
                "zklock_acquire_wait_seconds_count" => self.waits += value,
                "zklock_acquire_wait_seconds_bucket" => {
                    let le = match label("le") {
                        Some("+Inf") => f64::INFINITY,
                        Some(le) => match le.parse() {
                            Ok(le) => le,
                            Err(_) => continue,
                        },
                        None => continue,
                    };
                    match self.wait_buckets.iter_mut().find(|(b, _)| *b == le) {
                        Some((_, count)) => *count += value,
                        None => self.wait_buckets.push((le, value)),
                    }
                }
                _ => {}
            }
        }
        self.wait_buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    }

    /// The upper bound of the histogram bucket that holds the `q` quantile of the waits (the
    /// precision of the buckets); `None` without waits.
    pub fn wait_quantile(&self, q: f64) -> Option<f64> {
        if self.waits <= 0.0 {
            return None;
        }
        let rank = q * self.waits;
        self.wait_buckets
            .iter()
            .find(|(_, count)| *count >= rank)
            .map(|(le, _)| *le)
    }
}
