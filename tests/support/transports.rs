//! Transport doubles for unit-style tests of dispatch failure. The real transports are
//! exercised elsewhere; these only stand in where a test needs a dispatch to fail or to be
//! observed.

use std::sync::Mutex;

use taskdeck::job::Dispatch;
use taskdeck::transport::{Transport, TransportError};

/// Refuses every dispatch, like a broker that is down.
pub struct Down;

#[async_trait::async_trait]
impl Transport for Down {
    fn name(&self) -> &'static str {
        "down"
    }
    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError> {
        Err(TransportError::nothing_sent("down", "connection refused", jobs))
    }
}

/// Accepts dispatches and remembers them, like a queue nobody consumes yet.
#[derive(Default)]
pub struct Recorded(pub Mutex<Vec<Dispatch>>);

#[async_trait::async_trait]
impl Transport for Recorded {
    fn name(&self) -> &'static str {
        "recorded"
    }
    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError> {
        self.0.lock().expect("lock").extend_from_slice(jobs);
        Ok(())
    }
}

impl Recorded {
    pub fn take(&self) -> Vec<Dispatch> {
        std::mem::take(&mut *self.0.lock().expect("lock"))
    }
}

/// Sends every other job of a dispatch and refuses the rest, like an SQS batch with some
/// entries refused.
pub struct Partial;

#[async_trait::async_trait]
impl Transport for Partial {
    fn name(&self) -> &'static str {
        "partial"
    }
    async fn dispatch(&self, jobs: &[Dispatch]) -> Result<(), TransportError> {
        let refused: Vec<Dispatch> = jobs.iter().skip(1).step_by(2).copied().collect();
        if refused.is_empty() {
            return Ok(());
        }
        Err(TransportError::nothing_sent("partial", "some entries refused", &refused))
    }
}
