//! Recipient pages of campaigns that take their list after submit (`email::campaign`), kept
//! as the JSON they came in; the campaign reads its recipients out of them.

use serde_json::Value;

use super::{GenericClient, StoreError};
use crate::job::JobId;

/// What storing a page found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    New,
    /// The same page was stored before, with the same recipients: a replay.
    Replay,
    /// The page was stored before with other recipients: refused.
    Conflict,
}

/// Store one page (idempotent per page), and say how many pages the campaign now has.
pub async fn put(
    db: &impl GenericClient,
    job_id: JobId,
    page: i32,
    recipients: &Value,
) -> Result<(Stored, i64), StoreError> {
    let inserted = db
        .execute(
            "INSERT INTO campaign_pages (job_id, page, recipients) VALUES ($1, $2, $3) ON CONFLICT DO NOTHING",
            &[&job_id, &page, recipients],
        )
        .await?;
    let stored = if inserted == 1 {
        Stored::New
    } else {
        let same: bool = db
            .query_one(
                "SELECT recipients = $3 FROM campaign_pages WHERE job_id = $1 AND page = $2",
                &[&job_id, &page, recipients],
            )
            .await?
            .get(0);
        if same { Stored::Replay } else { Stored::Conflict }
    };
    let count: i64 = db.query_one("SELECT count(*) FROM campaign_pages WHERE job_id = $1", &[&job_id]).await?.get(0);
    Ok((stored, count))
}

/// Every page of a campaign, in page order, as stored.
pub async fn all(db: &impl GenericClient, job_id: JobId) -> Result<Vec<Value>, StoreError> {
    let rows = db.query("SELECT recipients FROM campaign_pages WHERE job_id = $1 ORDER BY page", &[&job_id]).await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}
