//! The one SES call: `SendEmail` (SES v2, raw MIME built by `mime`) with the SDK's own retries off, so Relay's state
//! machine alone decides what happens next, and every way it can end classified:
//! sent, throttled (nothing sent: retry later), rejected (nothing sent: never will be), or
//! ambiguous (the request may have reached SES: never retried automatically). And the read
//! of the account's quota (`GetAccount`) the sweep makes for `pace`.

use std::error::Error as _;
use std::time::Duration;

use aws_config::SdkConfig;
use aws_sdk_sesv2::Client;
use aws_sdk_sesv2::config::retry::RetryConfig;
use aws_sdk_sesv2::config::timeout::TimeoutConfig;
use aws_sdk_sesv2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_sesv2::operation::get_account::GetAccountError;
use aws_sdk_sesv2::operation::send_email::SendEmailError;
use aws_sdk_sesv2::primitives::Blob;
use aws_sdk_sesv2::types::{Destination, EmailContent, ListManagementOptions, MessageTag, RawMessage};

use super::content::{CORRELATION_HEADER, Rendered, SendParams, tag_value};
use super::departure::{Departing, Departure, PastSlot};
use crate::plain::NameValue;
use crate::store::messages::{AttachmentPreview, PartPreview, Preview};

/// The write switch by which a deployment uses SES tenants (`write:ses_tenants`): each send
/// names its Relay tenant's SES tenant (`tenant_name`).
pub const TENANTS: &str = "ses_tenants";

/// A send that has not answered in this long is abandoned, and its outcome is unknown.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How a send ended when it did not succeed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SendFailure {
    /// SES refused for now (throttling, sending quota); nothing was sent.
    #[error("throttled: {0}")]
    Throttled(String),
    /// SES refused for good (unverified identity, bad content, suppressed by SES...).
    #[error("rejected: {0}")]
    Rejected(String),
    /// The request never left (no connection could be made); nothing was sent.
    #[error("not sent: {0}")]
    NotSent(String),
    /// The request may have reached SES (timeout, reset, a 5xx, an unreadable answer).
    #[error("outcome unknown: {0}")]
    Ambiguous(String),
    /// The request could not leave by its departure's end, so it was not sent (`pace::Booked`).
    #[error("not sent: it would have left after its send slot")]
    MissedSlot,
    /// SES paused sending (the SES tenant the send named, or the account); nothing was sent.
    #[error("not sent: SES paused sending: {0}")]
    Paused(String),
}

/// The SES tenant a Relay tenant's sends name when the deployment uses SES tenants
/// (`write:ses_tenants`): `relay-` and the tenant's id (SES allows 1–64 letters, digits, `-`, `_`).
pub fn tenant_name(tenant: crate::job::TenantId) -> String {
    format!("relay-{tenant}")
}

/// Whether this error is `Departing`'s refusal (nothing was written).
fn past_slot(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(e) = next {
        if e.is::<PastSlot>() {
            return true;
        }
        next = e.source();
    }
    false
}

/// What identifies a message at SES and in its events.
pub struct Identity<'a> {
    pub message_id: &'a str,
    pub job_id: &'a str,
    pub correlation_id: &'a str,
    /// The SES tenant the send names (`TenantName`), when the deployment uses SES tenants.
    pub ses_tenant: Option<&'a str>,
    /// The SES contact list and topic of the send's topic, when the tenant maps it onto SES
    /// (`ListManagementOptions`: SES adds its own unsubscribe link and header).
    pub list: Option<(&'a str, &'a str)>,
}

/// An SES client for one run: this job's credentials, no SDK retries, a hard time limit.
pub fn client(config: &SdkConfig) -> Client {
    let conf = aws_sdk_sesv2::config::Builder::from(config)
        .retry_config(RetryConfig::disabled())
        .timeout_config(TimeoutConfig::builder().operation_timeout(SEND_TIMEOUT).build())
        .build();
    Client::from_conf(conf)
}

/// The headers a message is sent with: the client's, those rendered for this message
/// (`list_unsubscribe`), then Relay's correlation header.
pub fn headers(p: &SendParams, body: &Rendered, id: &Identity<'_>) -> Vec<NameValue> {
    let mut headers: Vec<NameValue> = p.headers.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    headers.extend(body.headers.iter().cloned());
    headers.push((CORRELATION_HEADER.to_owned(), id.correlation_id.to_owned()));
    headers
}

/// The SES tags a message is sent with: the client's, then Relay's own.
pub fn tags(p: &SendParams, id: &Identity<'_>) -> Vec<NameValue> {
    let relay = [
        ("relay_message_id", id.message_id.to_owned()),
        ("relay_job_id", id.job_id.to_owned()),
        (super::events::CORRELATION_TAG, tag_value(id.correlation_id)),
    ];
    p.tags
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .chain(relay.into_iter().map(|(k, v)| (k.to_owned(), v)))
        .collect()
}

/// The message as sent: MIME built by `mime::build` from the rendered content, the client's
/// parts and attachments, and `headers`. Its `Message-ID` is Relay's message id (SES sets its own).
pub fn raw_message(p: &SendParams, body: &Rendered, id: &Identity<'_>) -> Result<Vec<u8>, super::mime::BuildError> {
    let headers = headers(p, body, id);
    let domain = p.from.rsplit_once('@').map_or("relay", |(_, d)| d.trim_end_matches('>'));
    let message_id = format!("{}@{domain}", id.message_id);
    super::mime::build(&super::mime::Envelope {
        from: &p.from,
        to: &p.to,
        cc: &p.cc,
        reply_to: &p.reply_to,
        subject: &body.subject,
        text: body.text.as_deref(),
        html: body.html.as_deref(),
        headers: &headers,
        parts: &p.parts,
        attachments: &p.attachments,
        message_id: &message_id,
    })
}

/// Send once, as raw MIME (the envelope's recipients, `bcc` too, in `Destination`; the header
/// carries no `Bcc`); `raw` is `raw_message`'s, built before the send's slot; with a
/// `departure`, the request leaves at its slot, or not at all when it could not leave by its
/// end (`SendFailure::MissedSlot`). Returns SES's message id.
pub async fn send(
    client: &Client,
    p: &SendParams,
    raw: &[u8],
    id: &Identity<'_>,
    departure: Option<Departure>,
) -> Result<String, SendFailure> {
    let raw = RawMessage::builder().data(Blob::new(raw)).build().map_err(|e| SendFailure::Rejected(e.to_string()))?;
    let from = super::content::bare(&p.from).unwrap_or_else(|| p.from.clone());
    let mut request = client
        .send_email()
        .from_email_address(from)
        .destination(
            Destination::builder()
                .set_to_addresses(Some(p.to.clone()))
                .set_cc_addresses(Some(p.cc.clone()))
                .set_bcc_addresses(Some(p.bcc.clone()))
                .build(),
        )
        .content(EmailContent::builder().raw(raw).build())
        .set_configuration_set_name(p.configuration_set.clone())
        .set_tenant_name(id.ses_tenant.map(str::to_owned))
        .set_list_management_options(
            id.list
                .map(|(list, topic)| ListManagementOptions::builder().contact_list_name(list).topic_name(topic).build())
                .transpose()
                .map_err(|e| SendFailure::Rejected(e.to_string()))?,
        );
    for (name, value) in tags(p, id) {
        let tag =
            MessageTag::builder().name(name).value(value).build().map_err(|e| SendFailure::Rejected(e.to_string()))?;
        request = request.email_tags(tag);
    }
    let sent = match departure {
        Some(departure) => {
            let paced = aws_sdk_sesv2::config::Builder::new().http_client(Departing(departure));
            request.customize().config_override(paced).send().await
        }
        None => request.send().await,
    };
    match sent {
        Ok(out) => out
            .message_id()
            .map(str::to_owned)
            .ok_or_else(|| SendFailure::Ambiguous("SES answered without a message id".into())),
        Err(e) if past_slot(&e) => Err(SendFailure::MissedSlot),
        Err(e) => Err(classify(e)),
    }
}

/// Sort an SDK error into what Relay may do next. Anything not known to be safe is ambiguous.
pub fn classify(e: SdkError<SendEmailError>) -> SendFailure {
    let said = DisplayErrorContext(&e).to_string();
    match &e {
        SdkError::ConstructionFailure(_) => SendFailure::Rejected(said),
        SdkError::DispatchFailure(d) if never_connected(d.as_connector_error()) => SendFailure::NotSent(said),
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            let code = s.err().code().unwrap_or_default();
            match (status, code) {
                (429, _)
                | (_, "TooManyRequestsException" | "LimitExceededException" | "Throttling" | "ThrottlingException") => {
                    SendFailure::Throttled(said)
                }
                // SES paused the tenant (or the account): nothing was sent, and a retry would
                // meet the same pause.
                (_, "SendingPausedException" | "AccountSuspendedException") => SendFailure::Paused(said),
                // A 5xx means the request reached SES and something failed there, maybe after
                // the message was accepted.
                (500..=599, _) => SendFailure::Ambiguous(said),
                (400..=499, _) => SendFailure::Rejected(said),
                _ => SendFailure::Ambiguous(said),
            }
        }
        // Timeouts, resets, unreadable answers: the request may have been processed.
        _ => SendFailure::Ambiguous(said),
    }
}

/// Whether the connection was never made (so the request never left this machine).
fn never_connected(e: Option<&aws_sdk_sesv2::error::ConnectorError>) -> bool {
    let Some(e) = e else { return false };
    let mut source: Option<&(dyn std::error::Error + 'static)> = e.source();
    while let Some(s) = source {
        if let Some(h) = s.downcast_ref::<hyper_util::client::legacy::Error>()
            && h.is_connect()
        {
            return true;
        }
        source = s.source();
    }
    false
}

/// Why the account's quota could not be read.
#[derive(Debug, thiserror::Error)]
pub enum QuotaError {
    #[error("{}", DisplayErrorContext(.0))]
    Call(Box<SdkError<GetAccountError>>),
    #[error("GetAccount answered without a SendQuota")]
    NoQuota,
}

/// What SES says of the account (`GetAccount`'s `SendQuota`): (`MaxSendRate`,
/// `Max24HourSend`, `SentLast24Hours`).
pub async fn account_quota(client: &Client) -> Result<(f64, f64, f64), QuotaError> {
    let out = client.get_account().send().await.map_err(|e| QuotaError::Call(Box::new(e)))?;
    let q = out.send_quota().ok_or(QuotaError::NoQuota)?;
    Ok((q.max_send_rate(), q.max24_hour_send(), q.sent_last24_hours()))
}

/// What the SES request would carry (`send`), kept on a shadowed message.
pub fn preview(p: &SendParams, body: &Rendered, message_id: uuid::Uuid, ctx: &crate::task::TaskContext) -> Preview {
    let (message_id, job_id) = (message_id.to_string(), ctx.job_id.to_string());
    let id = Identity {
        message_id: &message_id,
        job_id: &job_id,
        correlation_id: &ctx.correlation_id,
        ses_tenant: None,
        list: None,
    };
    Preview {
        from: p.from.clone(),
        to: p.to.clone(),
        cc: p.cc.clone(),
        bcc: p.bcc.clone(),
        reply_to: p.reply_to.clone(),
        subject: body.subject.clone(),
        text: body.text.clone(),
        html: body.html.clone(),
        headers: headers(p, body, &id).into_iter().collect(),
        tags: tags(p, &id).into_iter().collect(),
        configuration_set: p.configuration_set.clone(),
        parts: p
            .parts
            .iter()
            .map(|x| PartPreview {
                content_type: super::mime::part_type(x).map_or_else(|_| x.content_type.clone(), |m| m.to_text()),
                size: x.content.len(),
                content: x.content.clone(),
            })
            .collect(),
        attachments: p
            .attachments
            .iter()
            .map(|a| AttachmentPreview {
                filename: a.filename.clone(),
                content_type: super::media_type::media_type(&a.content_type)
                    .map_or_else(|_| a.content_type.clone(), |m| m.to_text()),
                disposition: serde_json::to_value(a.disposition)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_owned))
                    .unwrap_or_default(),
                content_id: a.content_id.clone(),
                size: super::mime::decoded_size(&a.content_base64),
            })
            .collect(),
    }
}
