//! taskdeck: Relay's core. Each Lambda in `functions/` and the `relay` binary only wire
//! configuration, pools and clients, then call into this crate.

pub mod alerts;
pub mod api;
pub mod bench;
pub mod callbacks;
pub mod chaos;
pub mod catalogue;
pub mod client;
pub mod config;
pub mod credentials;
pub mod email;
pub mod exceptions;
pub mod console;
pub mod executor;
pub mod intake;
pub mod job;
pub mod lambda;
pub mod liveness;
pub mod localaws;
pub mod metrics;
pub mod pgcluster;
pub mod platform;
pub mod progress;
pub mod retry;
pub mod schedules;
pub mod status;
pub mod store;
pub mod sweep;
pub mod telemetry;
pub mod transport;
pub mod view;
pub mod watchdog;
