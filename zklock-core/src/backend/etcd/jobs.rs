//! A scheduled job's run record: [`EtcdBackend::claim`] puts `<path>%RUN` unless it exists, on
//! a lease of its own that lasts the job's `at_least` window by etcd's clock.

use std::time::Duration;

use super::{error, session, wire, EtcdBackend};
use crate::backend::LockTarget;
use crate::types::error::Result;

/// How much of a job's window a claim may spend between its run lease's grant and its record's
/// put before the lease's TTL is started again: about what the body's start lags the claim by.
const CLAIM_DELAY_ALLOWED: Duration = Duration::from_millis(25);

impl EtcdBackend {
    /// A job's run: the record `<path>%RUN`, put unless it exists, on a lease of its own that
    /// lasts `at_least` (rounded up to whole seconds) by etcd's clock.
    pub(super) async fn claim(&self, target: &LockTarget, at_least: Duration) -> Result<bool> {
        if at_least.is_zero() {
            return Ok(true);
        }
        let inner = &self.inner;
        let record = crate::types::layout::run_record(&target.path);
        let secs = at_least.as_secs() + u64::from(at_least.subsec_nanos() > 0);
        let mut client = inner.client.clone();
        inner.count_request();
        let asked = std::time::Instant::now();
        let lease = error::bounded(
            "grant the job's run lease",
            inner.config.reply_timeout,
            client.lease_grant(secs.min(i64::MAX as u64) as i64, None),
        )
        .await?;
        let claim = format!("{} lease={:x}", inner.owner_value(), lease.id());
        let put = wire::put_run_record(&record, &claim, lease.id());
        let mut attempts = 0;
        let resp = loop {
            match wire::txn(inner, "record the job's run", put.clone()).await {
                Ok(resp) => break resp,
                Err(e) if e.transient && attempts < 3 => attempts += 1,
                Err(e) => return Err(e.error),
            }
        };
        // A retry after a lost reply finds its own record.
        let own = resp.succeeded()
            || resp.op_responses().into_iter().any(|r| match r {
                etcd_client::TxnOpResponse::Get(g) => {
                    g.kvs().first().is_some_and(|kv| kv.lease() == lease.id())
                }
                _ => false,
            });
        if own {
            // The window runs from the lease's grant, which etcd applied before the record's
            // put: a claim held up between the two (a stalled server, a put tried again) would
            // leave a window short by that much. Past the rounding's slack, one keep-alive
            // starts the lease's TTL again, after the put.
            let granted = Duration::from_secs(lease.ttl().max(0) as u64);
            let slack = granted.saturating_sub(at_least) + CLAIM_DELAY_ALLOWED;
            if asked.elapsed() > slack {
                return self.restart_window(lease.id()).await;
            }
            return Ok(true);
        }
        let id = lease.id();
        let mut client = inner.client.clone();
        inner.background.spawn(&inner.runtime, async move {
            let _ = tokio::time::timeout(Duration::from_secs(2), client.lease_revoke(id)).await;
        });
        Ok(false)
    }

    /// Starts the TTL of the run record's lease `id` again with a keep-alive answered within
    /// [`CLAIM_DELAY_ALLOWED`] of its sending (etcd applied it in between, so the window then
    /// counts from no earlier than the body's start less that): whether the lease (and the
    /// record on it) was still there and so kept. A few tries; then the run is given up and its
    /// record left to its lease.
    async fn restart_window(&self, id: i64) -> Result<bool> {
        let inner = &self.inner;
        let mut client = inner.client.clone();
        let operation = "keep the job's run lease from its claim";
        let bound = inner.config.reply_timeout;
        let mut stream = error::bounded(operation, bound, client.lease_keep_alive(id)).await?;
        for _ in 0..3 {
            inner.count_request();
            let sent = std::time::Instant::now();
            let ttl = tokio::time::timeout(bound, session::renew(&mut stream))
                .await
                .map_err(|_| error::timed_out(operation))??;
            // The lease ran out before the claim's answer came: the record went with it, and
            // another instance may have claimed since. Not this run's.
            if ttl <= 0 {
                return Ok(false);
            }
            if sent.elapsed() <= CLAIM_DELAY_ALLOWED {
                return Ok(true);
            }
        }
        tracing::warn!(
            "zklock: etcd answered the job's claim too slowly to keep its at_least window from \
             the run's start; the run is skipped"
        );
        Ok(false)
    }
}
