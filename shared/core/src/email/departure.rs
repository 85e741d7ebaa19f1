//! A paced send's departure. Its request, built and signed by the SDK, is handed to a thread of
//! its own that sleeps until the send's slot and writes it then, or not at all once the slot is
//! past by more than `pace::LATE_SLOT`. On the worker's runtime the wake-up waited for a core
//! among the jobs' own work (a median of 12 ms late, 84 ms at the 99th percentile, in a debug
//! build on a loaded 2-core machine); a thread that only sleeps and writes is woken at once.
//! Its connections to SES are kept between sends, on that thread, so a send does not open one
//! after its slot; only for `KEEP_IDLE`, well inside any server's keep-alive, so a request is
//! never written into a connection the server closed meanwhile (a frozen Lambda container's, say):
//! that would be an ambiguous send.

use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aws_sdk_sesv2::config::http::HttpRequest;
use aws_sdk_sesv2::config::{HttpClient, RuntimeComponents, SharedHttpClient};
use aws_smithy_http_client::tls;
use aws_smithy_runtime_api::client::http::{
    HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpConnector,
};
use aws_smithy_runtime_api::client::result::ConnectorError;

/// How long an idle connection to SES is kept for the next send.
pub const KEEP_IDLE: Duration = Duration::from_secs(4);

/// When a paced send's request may leave (its slot), and by when it must have (`pace::Booked`).
#[derive(Debug, Clone, Copy)]
pub struct Departure {
    pub at: Instant,
    pub by: Instant,
}

/// The refusal of a request whose slot passed before it could leave: nothing was written.
#[derive(Debug, thiserror::Error)]
#[error("the send's slot has passed")]
pub struct PastSlot;

/// The departure thread's runtime, and the HTTP client (the SDK's default) whose connections
/// live there.
struct Gate {
    runtime: tokio::runtime::Handle,
    http: SharedHttpClient,
}

/// The departure thread, started on first use. None if it could not be started: then a send
/// waits for its slot on the caller's runtime.
fn gate() -> Option<&'static Gate> {
    static GATE: OnceLock<Option<Gate>> = OnceLock::new();
    GATE.get_or_init(|| {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().ok()?;
        let handle = runtime.handle().clone();
        std::thread::Builder::new()
            .name("relay-departures".into())
            .spawn(move || runtime.block_on(std::future::pending::<()>()))
            .ok()?;
        Some(Gate { runtime: handle, http: https() })
    })
    .as_ref()
}

/// The HTTP client for one paced send (`config_override` of its operation).
#[derive(Debug)]
pub struct Departing(pub Departure);

impl HttpClient for Departing {
    fn http_connector(&self, settings: &HttpConnectorSettings, components: &RuntimeComponents) -> SharedHttpConnector {
        let (inner, runtime) = match gate() {
            Some(g) => (g.http.http_connector(settings, components), Some(g.runtime.clone())),
            None => (https().http_connector(settings, components), None),
        };
        SharedHttpConnector::new(DepartingConnector { inner, runtime, departure: self.0 })
    }
}

/// The SDK's default HTTPS client, keeping idle connections for `KEEP_IDLE`: the departure
/// thread's, or one per send when that thread could not be started.
fn https() -> SharedHttpClient {
    aws_smithy_http_client::Builder::new()
        .pool_idle_timeout(KEEP_IDLE)
        .tls_provider(tls::Provider::Rustls(tls::rustls_provider::CryptoMode::AwsLc))
        .build_https()
}

#[derive(Debug)]
struct DepartingConnector {
    inner: SharedHttpConnector,
    runtime: Option<tokio::runtime::Handle>,
    departure: Departure,
}

impl HttpConnector for DepartingConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let leave = depart(self.inner.clone(), self.departure, request);
        let Some(runtime) = &self.runtime else { return HttpConnectorFuture::new(leave) };
        let task = Aborting(runtime.spawn(leave));
        HttpConnectorFuture::new(async move {
            let mut task = task;
            // A task that panicked or was cancelled may have written the request: unknown.
            (&mut task.0).await.unwrap_or_else(|e| Err(ConnectorError::other(Box::new(e), None)))
        })
    }
}

/// Sleep until the slot, then write the request, unless the slot is too far past.
async fn depart(
    inner: SharedHttpConnector,
    departure: Departure,
    request: HttpRequest,
) -> Result<aws_sdk_sesv2::config::http::HttpResponse, ConnectorError> {
    tokio::time::sleep_until(departure.at.into()).await;
    let now = Instant::now();
    let late_us = now.saturating_duration_since(departure.at).as_micros() as u64;
    tracing::debug!(event = "relay.email.departed", late_us, "a paced send reached its slot");
    if now > departure.by {
        return Err(ConnectorError::user(Box::new(PastSlot)));
    }
    inner.call(request).await
}

/// The departure's task, cancelled when the send stops waiting for it (its time limit).
struct Aborting<T>(tokio::task::JoinHandle<T>);

impl<T> Drop for Aborting<T> {
    fn drop(&mut self) {
        self.0.abort();
    }
}
