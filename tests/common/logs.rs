//! Log lines captured as text, for tests that check what a person would read.

use std::io;
use std::sync::{Arc, Mutex};

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::util::SubscriberInitExt;

/// The lines written while the capture lives, as text.
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// How many lines contain `needle`.
    pub fn count(&self, needle: &str) -> usize {
        self.text().lines().filter(|l| l.contains(needle)).count()
    }
}

impl io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for Logs {
    type Writer = Logs;
    fn make_writer(&'a self) -> Logs {
        self.clone()
    }
}

/// Captures the current thread's events at `level` and above (a multi-threaded test's
/// other threads are not captured); the capture stops when the guard is dropped.
pub fn capture(level: LevelFilter) -> (Logs, impl Sized) {
    let logs = Logs::default();
    let guard = tracing_subscriber::fmt()
        .with_writer(logs.clone())
        .with_max_level(level)
        .with_ansi(false)
        .set_default();
    (logs, guard)
}
