//! [`Backoff`]: the pause before trying again after a failure on a connection, doubled after
//! each failure up to a bound and started over after a success. Every backend's retries (of an
//! attempt, a release, a reconnection, a subscription) pause with it.

// ZooKeeper alone (a build without the lease backends) uses only part of it.
#![cfg_attr(
    not(any(
        feature = "redis",
        feature = "postgres",
        feature = "etcd",
        feature = "mysql"
    )),
    allow(dead_code)
)]

use std::time::Duration;

/// The first pause before retrying a request that failed on its connection.
pub(crate) const RETRY_MIN: Duration = Duration::from_millis(20);

/// The longest pause between retries of a request.
pub(crate) const RETRY_MAX: Duration = Duration::from_secs(1);

/// Pauses that double from `min` to `max`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    /// Pauses from `min`, doubled up to `max`.
    pub(crate) const fn new(min: Duration, max: Duration) -> Backoff {
        Backoff {
            next: min,
            min,
            max,
        }
    }

    /// The pauses of a request's retries: from [`RETRY_MIN`] up to [`RETRY_MAX`].
    pub(crate) const fn requests() -> Backoff {
        Backoff::new(RETRY_MIN, RETRY_MAX)
    }

    /// The next pause, without taking it.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn peek(&self) -> Duration {
        self.next
    }

    /// Takes the next pause: returns it and doubles the one after (up to the bound).
    pub(crate) fn take(&mut self) -> Duration {
        let pause = self.next;
        self.next = (pause * 2).min(self.max);
        pause
    }

    /// Sleeps the next pause.
    pub(crate) async fn wait(&mut self) {
        tokio::time::sleep(self.take()).await;
    }

    /// Starts over from the first pause (after a success).
    pub(crate) fn reset(&mut self) {
        self.next = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pauses double up to the bound and start over after a reset.
    #[test]
    fn pauses_double_up_to_the_bound() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_millis(350));
        let taken: Vec<_> = (0..4).map(|_| b.take().as_millis()).collect();
        assert_eq!(taken, [100, 200, 350, 350]);
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(100));
    }
}
