//! `email.campaign`: one message to many recipients, as countable fan-out. The campaign
//! declares its total before it creates a child, then creates one `email.send` child per
//! recipient in chunks, each chunk committed (and dispatched) on its own. A child's idempotency
//! and message keys are the campaign and the recipient's position, so a campaign interrupted
//! mid-creation resumes where it stopped and never creates (or sends) a child twice. It creates
//! at most `children_per_run` children per run, then continues itself in a new run (so 100,000
//! recipients never make one long run), and once every child exists it waits; the sweep
//! finishes it with counts by outcome when every child has finished. Progress is read from the
//! children's rows (`progress`), never reported by the parent.
//!
//! Recipients come inline, or — for long lists — in pages uploaded after submit
//! (`PUT /v1/jobs/{id}/recipients/{page}`): such a campaign is held (not due) until its last
//! page lands.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

use super::content::SendParams;
use crate::job::terms::{Concurrency, CorrelationId, IdempotencyKey, Limits};
use crate::job::{Fence, JobId, TaskError};
use crate::plain::ParamError;
use crate::store::campaign_pages;
use crate::store::jobs::{self, NewJob};
use crate::task::TaskContext;

/// Children created per statement (one commit, one dispatch).
pub const CHUNK: usize = 1000;
/// Most recipients given inline (a longer list comes in pages).
pub const MAX_INLINE: usize = 10_000;
/// Most recipients per uploaded page, and most pages.
pub const MAX_PAGE: usize = 5_000;
pub const MAX_PAGES: u32 = 1_000;
pub const DEFAULT_CHILDREN_PER_RUN: u32 = 20_000;
/// Children of one campaign sending at once, unless the campaign says otherwise.
pub const DEFAULT_CONCURRENCY: i32 = 10;
/// Each child's attempts: the default number, of a minute each (one email).
const CHILD_LIMITS: Limits = Limits::fixed(crate::job::terms::DEFAULT_MAX_ATTEMPTS, 60);

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Recipient {
    pub to: String,
    /// Per-recipient template variables (over the message's own `data`).
    #[serde(default)]
    pub data: BTreeMap<String, Value>,
}

#[derive(Debug, Clone, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CampaignParams {
    /// What every recipient gets: `email.send`'s parameters without `to`, `cc`, `bcc` or
    /// `message_key`.
    pub message: SendParams,
    /// The recipients, inline (at most 10,000).
    #[serde(default)]
    pub recipients: Vec<Recipient>,
    /// Instead of `recipients`: how many pages of recipients will be uploaded
    /// (`PUT /v1/jobs/{id}/recipients/{page}`, pages 0 to pages-1); held until the last lands.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub pages: Option<u32>,
    /// Children sending at once (1 to 1000; default 10): their concurrency key is the campaign's.
    #[serde(default)]
    #[schema(minimum = 1, maximum = 1000)]
    pub concurrency_limit: Option<i32>,
    /// Children created per run before the campaign continues in a new run (100 to 100,000;
    /// default 20,000).
    #[serde(default)]
    #[schema(minimum = 100, maximum = 100_000)]
    pub children_per_run: Option<u32>,
}

/// The `email.send` parameters of one recipient's child: the message, addressed to the
/// recipient, with the recipient's data over the message's.
fn addressed(message: &SendParams, r: &Recipient) -> SendParams {
    let mut m = message.clone();
    m.to = vec![r.to.clone()];
    m.data.extend(r.data.clone());
    m
}

/// A recipient's child checked exactly as `email.send` checks a single send, so a mistake
/// every child would fail on is refused at submit; the error names the recipient's field
/// (`recipients[i].to`, `recipients[i].data`) or the message's. `message` passed the same
/// check already (with a sample recipient).
fn check_recipient(message: &SendParams, r: &Recipient, at: &str) -> Result<(), ParamError> {
    addressed(message, r).check().map_err(|ParamError { field: f, message: m }| match f.as_str() {
        f if f.starts_with("to") => ParamError::new(format!("{at}.to"), m),
        "data" if !r.data.is_empty() => ParamError::new(format!("{at}.data"), m),
        // The message's inline content compiled too: what fails to render now is this data.
        f @ ("subject" | "text" | "html") => ParamError::new(format!("{at}.data"), format!("{f}: {m}")),
        // The message's templates compiled (`check_message`): what fails now is this data.
        f if f.starts_with("list_unsubscribe.") => ParamError::new(format!("{at}.data"), format!("{f}: {m}")),
        f => ParamError::new(format!("message.{f}"), m),
    })
}

/// The message as every child gets it, checked with a sample recipient (a message error is
/// named once, not per recipient).
fn check_message(message: &SendParams) -> Result<(), ParamError> {
    let sample = Recipient { to: "recipient@example.com".into(), data: BTreeMap::new() };
    addressed(message, &sample).check_fields().map_err(|e| e.under("message"))
}

impl CampaignParams {
    pub fn check(&self) -> Result<(), ParamError> {
        let m = &self.message;
        if !(m.to.is_empty() && m.cc.is_empty() && m.bcc.is_empty()) {
            return Err(ParamError::new("message.to", "recipients come from `recipients` or pages, not the message"));
        }
        // Each child holds its own copy of the message: files would be copied per recipient,
        // and an invitation names its attendee. Send those as one `email.send` per recipient.
        for (field, given) in [("parts", !m.parts.is_empty()), ("attachments", !m.attachments.is_empty())] {
            if given {
                return Err(ParamError::new(
                    format!("message.{field}"),
                    format!("a campaign's message has no {field}; send them with one email.send per recipient"),
                ));
            }
        }
        if m.message_key.is_some() {
            return Err(ParamError::new(
                "message.message_key",
                "each child's message key is the campaign and its position",
            ));
        }
        match (self.recipients.len(), self.pages) {
            (0, None) => return Err(ParamError::new("recipients", "give recipients, or the number of pages to come")),
            (n, Some(_)) if n > 0 => return Err(ParamError::new("pages", "give recipients or pages, not both")),
            (_, Some(p)) if !(1..=MAX_PAGES).contains(&p) => {
                return Err(ParamError::new("pages", format!("1 to {MAX_PAGES} pages")));
            }
            (n, None) if n > MAX_INLINE => {
                return Err(ParamError::new(
                    "recipients",
                    format!("{n} recipients inline; at most {MAX_INLINE} (upload pages instead)"),
                ));
            }
            _ => {}
        }
        check_message(m)?;
        for (i, r) in self.recipients.iter().enumerate() {
            check_recipient(m, r, &format!("recipients[{i}]"))?;
        }
        if let Some(l) = self.concurrency_limit
            && !(1..=1000).contains(&l)
        {
            return Err(ParamError::new("concurrency_limit", "1 to 1000"));
        }
        if let Some(n) = self.children_per_run
            && !(100..=100_000).contains(&n)
        {
            return Err(ParamError::new("children_per_run", "100 to 100,000"));
        }
        Ok(())
    }

    /// Held until its recipient pages have all arrived.
    pub fn held(&self) -> bool {
        self.pages.is_some()
    }
}

/// Check one uploaded page against its campaign.
pub fn check_page(campaign: &CampaignParams, page: u32, recipients: &[Recipient]) -> Result<(), ParamError> {
    let Some(pages) = campaign.pages else {
        return Err(ParamError::new("page", "this campaign takes its recipients inline, not in pages"));
    };
    if page >= pages {
        return Err(ParamError::new("page", format!("this campaign has pages 0 to {}", pages - 1)));
    }
    if recipients.is_empty() || recipients.len() > MAX_PAGE {
        return Err(ParamError::new("recipients", format!("1 to {MAX_PAGE} recipients per page")));
    }
    for (i, r) in recipients.iter().enumerate() {
        check_recipient(&campaign.message, r, &format!("recipients[{i}]"))?;
    }
    Ok(())
}

/// The child for the recipient at `position` of the campaign `campaign`.
fn child(
    campaign: JobId,
    correlation_id: &CorrelationId,
    p: &CampaignParams,
    r: &Recipient,
    position: usize,
) -> NewJob {
    let mut m = addressed(&p.message, r);
    let key = IdempotencyKey::campaign_child(campaign, position);
    m.message_key = Some(key.as_str().to_owned());
    let params = serde_json::to_value(&m).unwrap_or_default();
    NewJob::child_of(
        campaign,
        correlation_id,
        NewJob {
            limits: CHILD_LIMITS,
            concurrency: Some(Concurrency::campaign(campaign, p.concurrency_limit.unwrap_or(DEFAULT_CONCURRENCY))),
            ..NewJob::new("email.send", params, key)
        },
    )
}

/// Run CPU-bound work (parsing 100,000 recipients, building a thousand children) on the
/// blocking pool: on a runtime thread it held up, for tens of milliseconds at a time, every
/// other job of the worker between two of its statements, the campaign's own children included.
async fn off_the_runtime<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T, TaskError> {
    tokio::task::spawn_blocking(work).await.map_err(|e| TaskError::Retryable(format!("building children: {e}")))
}

/// One run of a campaign: declare, create the next slice of children, then continue or wait.
pub async fn run(ctx: &TaskContext, p: CampaignParams) -> Result<Value, TaskError> {
    let db = ctx.db.get().await.map_err(TaskError::retryable)?;
    let recipients = match p.pages {
        None => p.recipients.clone(),
        Some(pages) => {
            let got = campaign_pages::all(&db, ctx.job_id).await.map_err(TaskError::retryable)?;
            if got.len() != pages as usize {
                return Err(TaskError::Fatal(format!("{} of {pages} recipient pages arrived", got.len())));
            }
            off_the_runtime(move || {
                got.into_iter()
                    .flat_map(|page| serde_json::from_value::<Vec<Recipient>>(page).unwrap_or_default())
                    .collect()
            })
            .await?
        }
    };
    let recipients = std::sync::Arc::new(recipients);
    let total = i32::try_from(recipients.len()).map_err(|_| TaskError::Fatal("too many recipients".into()))?;
    if !jobs::declare_children(&db, Fence { job: ctx.job_id, attempt: ctx.attempt }, total)
        .await
        .map_err(TaskError::retryable)?
    {
        return Err(TaskError::Retryable("this attempt no longer holds the campaign".into()));
    }
    // Each chunk commits whole, so the children that exist are whole chunks (a partial last
    // chunk only at the very end); created again, a child is found by its key, not duplicated.
    let existing =
        usize::try_from(jobs::count_children(&db, ctx.job_id).await.map_err(TaskError::retryable)?).unwrap_or(0);
    drop(db);
    let start = existing - existing % CHUNK;
    let per_run = p.children_per_run.unwrap_or(DEFAULT_CHILDREN_PER_RUN) as usize;
    let end = recipients.len().min(start + per_run);
    let p = std::sync::Arc::new(p);
    for from in (start..end).step_by(CHUNK) {
        let (campaign, correlation_id, p, recipients) =
            (ctx.job_id, CorrelationId::carried(&ctx.correlation_id), p.clone(), recipients.clone());
        let slice: Vec<NewJob> = off_the_runtime(move || {
            (from..end.min(from + CHUNK))
                .map(|pos| child(campaign, &correlation_id, &p, &recipients[pos], pos))
                .collect()
        })
        .await?;
        ctx.jobs.enqueue(ctx.tenant_id, slice).await.map_err(TaskError::retryable)?;
    }
    tracing::info!(event = "relay.campaign.children", created_up_to = end, total, "campaign children created");
    if end < recipients.len() {
        Err(TaskError::Continue(format!("children 0 to {end} of {total} exist")))
    } else {
        Err(TaskError::WaitForChildren(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn params(v: Value) -> CampaignParams {
        serde_json::from_value(v).unwrap()
    }

    fn message() -> Value {
        json!({"from": "news@acme.example", "subject": "News", "text": "Hello"})
    }

    #[test]
    fn a_campaign_names_its_recipients_once_and_well() {
        let ok =
            params(json!({"message": message(), "recipients": [{"to": "a@example.com"}, {"to": "b@example.com"}]}));
        assert_eq!(ok.check(), Ok(()));
        let templated = json!({"from": "news@acme.example", "template": "news"});
        let ok = params(
            json!({"message": templated, "recipients": [{"to": "a@example.com"}, {"to": "b@example.com", "data": {"n": 1}}]}),
        );
        assert_eq!(ok.check(), Ok(()));
        let field = |v: Value| params(v).check().unwrap_err().field;
        assert_eq!(field(json!({"message": message()})), "recipients");
        assert_eq!(
            field(json!({"message": message(), "recipients": [{"to": "a@example.com"}, {"to": "nope"}]})),
            "recipients[1].to"
        );
        assert_eq!(field(json!({"message": message(), "recipients": [{"to": "a@example.com"}], "pages": 2})), "pages");
        let mut with_to = message();
        with_to["to"] = json!(["x@example.com"]);
        assert_eq!(field(json!({"message": with_to, "pages": 1})), "message.to");
        assert_eq!(field(json!({"message": {"from": "news@acme.example"}, "pages": 1})), "message.subject");
        assert_eq!(field(json!({"message": message(), "pages": 1, "concurrency_limit": 0})), "concurrency_limit");
        assert!(params(json!({"message": message(), "pages": 3})).held());
        // What a single send refuses, a campaign refuses for the recipient it would fail on.
        // An inline template a recipient's data does not render (strict: `n` undefined).
        let mut inline = message();
        inline["text"] = json!("Hello {{ n }}");
        let missing = json!({"message": inline, "recipients": [{"to": "a@example.com", "data": {"n": 1}}, {"to": "b@example.com"}]});
        assert_eq!(params(missing).check().unwrap_err().field, "recipients[1].data");
        let mut message_data = inline.clone();
        message_data["data"] = json!({"n": 1});
        assert_eq!(params(json!({"message": message_data, "recipients": [{"to": "a@example.com"}]})).check(), Ok(()));
        inline["text"] = json!("Hello {{ n");
        assert_eq!(field(json!({"message": inline, "recipients": [{"to": "a@example.com"}]})), "message.text");
        let mut both = message();
        both["template"] = json!("news");
        assert_eq!(field(json!({"message": both, "recipients": [{"to": "a@example.com"}]})), "message.template");
    }

    #[test]
    fn pages_fit_their_campaign() {
        let c = params(json!({"message": message(), "pages": 2}));
        let r = |to: &str| Recipient { to: to.into(), data: BTreeMap::new() };
        assert_eq!(check_page(&c, 1, &[r("a@example.com")]), Ok(()));
        assert_eq!(check_page(&c, 2, &[r("a@example.com")]).unwrap_err().field, "page");
        assert_eq!(check_page(&c, 0, &[]).unwrap_err().field, "recipients");
        assert_eq!(check_page(&c, 0, &[r("bad")]).unwrap_err().field, "recipients[0].to");
    }

    #[test]
    fn a_child_is_email_send_params_that_check() {
        let m: SendParams =
            serde_json::from_value(json!({"from": "news@acme.example", "template": "t", "data": {"a": 1}})).unwrap();
        let mut m2 = m.clone();
        m2.to = vec!["x@example.com".into()];
        m2.message_key = Some("campaign:p:0".into());
        let v = serde_json::to_value(&m2).unwrap();
        let back: SendParams = serde_json::from_value(v.clone()).unwrap();
        assert_eq!(back.check(), Ok(()), "{v}");
        assert_eq!(v["template"], "t");
        assert!(v.get("subject").is_none());
    }
}
