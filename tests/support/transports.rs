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
    async fn dispatch(&self, _: &[Dispatch]) -> Result<(), TransportError> {
        Err(TransportError { transport: "down", message: "connection refused".into() })
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
