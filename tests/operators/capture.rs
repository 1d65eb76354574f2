//! What the operators' tests capture of zklock's tracing: everything traced at DEBUG on the
//! test's thread (a test on one thread captures what every task of its manager traces).

use std::io::Write;
use std::sync::{Arc, Mutex};

/// The captured output.
#[derive(Clone, Default)]
pub(crate) struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Starts capturing everything traced at DEBUG on this thread, until the guard is dropped.
    pub(crate) fn start() -> (Captured, tracing::subscriber::DefaultGuard) {
        let captured = Captured::default();
        let sink = captured.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::DEBUG)
            .with_ansi(false)
            .with_writer(move || sink.clone())
            .finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    /// What was captured so far.
    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}
