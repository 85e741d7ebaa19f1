//! `email.send`: one email through SES, at most once per tenant and message key (see
//! `crate::email` for how); `email.campaign`: one message to many (`crate::email::campaign`).

use serde_json::Value;

use crate::email::campaign::CampaignParams;
use crate::email::content::SendParams;
use crate::job::TaskError;
use crate::plain::ParamError;
use crate::task::{Admission, Named, Stored, Task, TaskContext};

pub struct SendEmail;

impl Task for SendEmail {
    type Params = SendParams;
    const NAME: &'static str = "email.send";
    const DESCRIPTION: &'static str =
        "Send one email through SES, at most once per message key; shadow mode records it without sending.";

    fn check(p: &SendParams) -> Result<(), ParamError> {
        p.check()
    }

    fn schema_rules(schema: &mut Value) {
        crate::email::rules::send(schema);
    }

    fn document_rules(schema: &mut Value) {
        crate::email::document::send(schema);
    }

    fn admit(p: &SendParams) -> Admission {
        let names =
            p.template.iter().map(|t| Named { kind: Stored::Template, field: "template".into(), name: t.clone() });
        Admission { held: false, names: names.collect() }
    }

    async fn run(&self, ctx: &TaskContext, p: SendParams) -> Result<Value, TaskError> {
        crate::email::send(ctx, p).await
    }
}

pub struct SendCampaign;

impl Task for SendCampaign {
    type Params = CampaignParams;
    const NAME: &'static str = "email.campaign";
    const DESCRIPTION: &'static str = "One message to many recipients: an email.send child per recipient, created in resumable \
         chunks; finishes with counts by outcome when every child has.";

    fn check(p: &CampaignParams) -> Result<(), ParamError> {
        p.check()
    }

    fn schema_rules(schema: &mut Value) {
        crate::email::rules::campaign(schema);
    }

    fn document_rules(schema: &mut Value) {
        crate::email::document::campaign(schema);
    }

    fn admit(p: &CampaignParams) -> Admission {
        let names = p.message.template.iter().map(|t| Named {
            kind: Stored::Template,
            field: "message.template".into(),
            name: t.clone(),
        });
        Admission { held: p.held(), names: names.collect() }
    }

    async fn run(&self, ctx: &TaskContext, p: CampaignParams) -> Result<Value, TaskError> {
        crate::email::campaign::run(ctx, p).await
    }
}
