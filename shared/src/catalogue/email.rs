//! `email.send`: one email through SES, at most once per tenant and message key (see
//! `crate::email` for how).

use serde_json::Value;

use super::{Task, TaskContext};
use crate::email::content::SendParams;
use crate::job::TaskError;

pub struct SendEmail;

impl Task for SendEmail {
    type Params = SendParams;
    const NAME: &'static str = "email.send";
    const DESCRIPTION: &'static str = "Send one email through SES, at most once per message key; shadow mode records it without sending.";

    fn check(p: &SendParams) -> Result<(), (String, String)> {
        p.check()
    }

    async fn run(&self, ctx: &TaskContext, p: SendParams) -> Result<Value, TaskError> {
        crate::email::send(ctx, p).await
    }
}
