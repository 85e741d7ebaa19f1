//! Correlation in every log line: a span around each task run and each API request, carrying
//! the correlation id (and the job id). Log formatters that print span fields (the JSON lines
//! of `relay` and the Lambda functions do) put them on every line inside.

use tracing::Span;
use tracing::field::{Empty, display};

use crate::job::ClaimedJob;

/// The span of one attempt of one job.
pub fn job_span(job: &ClaimedJob) -> Span {
    tracing::info_span!("job", job_id = %job.id, correlation_id = %job.correlation_id,
        task_type = %job.task_type, attempt = job.attempt)
}

/// The span of one API request; a handler fills in the correlation id and job id once known.
pub fn request_span(method: &str, path: &str) -> Span {
    tracing::info_span!("request", method, path, correlation_id = Empty, job_id = Empty)
}

/// Name the job (and its correlation id) the current request is about.
pub fn record_job(correlation_id: &str, job_id: crate::job::JobId) {
    let span = Span::current();
    span.record("correlation_id", correlation_id);
    span.record("job_id", display(job_id));
}

/// Name the correlation id the current request is about.
pub fn record_correlation(correlation_id: &str) {
    Span::current().record("correlation_id", correlation_id);
}
