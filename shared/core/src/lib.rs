//! taskdeck: Relay's core, the platform itself. Each Lambda in `functions/` and the `relay`
//! tool only wire configuration, pools and clients, then call into this crate.

pub mod alerts;
pub mod api;
pub mod callbacks;
pub mod catalogue;
pub mod client;
pub mod config;
pub mod credentials;
pub mod email;
pub mod exceptions;
pub mod executor;
pub mod intake;
pub mod job;
pub mod lambda;
pub mod liveness;
pub mod metrics;
pub mod platform;
pub mod progress;
pub mod retry;
pub mod schedules;
pub mod store;
pub mod sweep;
pub mod task;
pub mod telemetry;
pub mod transport;
pub mod view;
