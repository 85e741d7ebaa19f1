//! The `dead_letters` table: messages that could not become work, kept whole with the reason.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::{GenericClient, StoreError};

/// A message to keep.
#[derive(Debug, Clone, PartialEq)]
pub struct NewDeadLetter {
    pub source: String,
    pub message_id: Option<String>,
    pub body: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    pub id: Uuid,
    pub source: String,
    pub message_id: Option<String>,
    pub body: String,
    pub reason: String,
    pub received_at: DateTime<Utc>,
}

/// Postgres text cannot hold NUL: replace it, keeping everything else exactly.
fn storable(s: &str) -> String {
    s.replace('\0', "\u{FFFD}")
}

/// Keep messages in one statement. A message already kept (same source and message id: a
/// redelivery) is not kept twice. Returns how many rows were new.
pub async fn insert_many(db: &impl GenericClient, letters: &[NewDeadLetter]) -> Result<u64, StoreError> {
    if letters.is_empty() {
        return Ok(0);
    }
    let stmt = db
        .prepare_cached(
            "INSERT INTO dead_letters (id, source, message_id, body, reason)
             SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[])
             ON CONFLICT (source, message_id) WHERE message_id IS NOT NULL DO NOTHING",
        )
        .await?;
    let ids: Vec<Uuid> = letters.iter().map(|_| Uuid::now_v7()).collect();
    let sources: Vec<String> = letters.iter().map(|l| storable(&l.source)).collect();
    let message_ids: Vec<Option<String>> = letters.iter().map(|l| l.message_id.as_deref().map(storable)).collect();
    let bodies: Vec<String> = letters.iter().map(|l| storable(&l.body)).collect();
    let reasons: Vec<String> = letters.iter().map(|l| storable(&l.reason)).collect();
    Ok(db.execute(&stmt, &[&ids, &sources, &message_ids, &bodies, &reasons]).await?)
}

/// How many messages were kept since `since` (the status contract's `dead_letters_24h`).
pub async fn count_since(db: &impl GenericClient, since: DateTime<Utc>) -> Result<i64, StoreError> {
    let row = db.query_one("SELECT count(*) FROM dead_letters WHERE received_at >= $1", &[&since]).await?;
    Ok(row.get(0))
}

/// The most recent dead letters, newest first.
pub async fn recent(db: &impl GenericClient, limit: i64) -> Result<Vec<DeadLetter>, StoreError> {
    let rows = db
        .query(
            "SELECT id, source, message_id, body, reason, received_at FROM dead_letters
             ORDER BY received_at DESC, id DESC LIMIT $1",
            &[&limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| DeadLetter {
            id: r.get(0),
            source: r.get(1),
            message_id: r.get(2),
            body: r.get(3),
            reason: r.get(4),
            received_at: r.get(5),
        })
        .collect())
}
