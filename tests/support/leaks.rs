//! Looking for a secret where it must not be: every row of a test's schema, and the log lines
//! written while a test runs (the shared part of the leak checks of `http_leaks`, `http_oauth`
//! and `callbacks`).

use std::sync::{Arc, Mutex};

use super::World;

/// Every row of every table of the test's schema, as text, holding `mark`.
pub async fn rows_holding(w: &World, mark: &str) -> Vec<String> {
    let db = w.db().await;
    let tables = db
        .query("SELECT table_name::text FROM information_schema.tables WHERE table_schema = current_schema()", &[])
        .await
        .unwrap();
    let mut found = Vec::new();
    for t in tables {
        let name: String = t.get(0);
        let sql = format!("SELECT t::text FROM \"{name}\" t WHERE t::text LIKE '%' || $1 || '%'");
        for r in db.query(&sql, &[&mark]).await.unwrap() {
            found.push(format!("{name}: {}", r.get::<_, String>(0)));
        }
    }
    found
}

/// A writer that keeps every log line in memory (clones share the lines).
#[derive(Clone, Default)]
pub struct Lines(Arc<Mutex<Vec<u8>>>);

impl Lines {
    /// What was written so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Every log line (every level, as JSON) written on this thread while the guard lives.
pub fn capture_this_thread() -> (Lines, tracing::subscriber::DefaultGuard) {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::DEBUG)
        .with_writer(move || writer.clone())
        .finish();
    (lines, tracing::subscriber::set_default(subscriber))
}
