//! The migration runner: applies `migrations/*.sql` in order, once each, recorded in
//! `relay_migrations`. Several processes may migrate at once; an advisory lock serialises them.

use sha2::{Digest, Sha256};

use super::StoreError;

/// Every migration, in order. Adding one: a new file in `migrations/` and a line here
/// (a test fails when the two disagree).
pub const MIGRATIONS: &[(i32, &str, &str)] = &[
    (1, "0001_core", include_str!("../../../../migrations/0001_core.sql")),
    (2, "0002_dead_letters", include_str!("../../../../migrations/0002_dead_letters.sql")),
    (3, "0003_attempt_sessions", include_str!("../../../../migrations/0003_attempt_sessions.sql")),
    (4, "0004_operations", include_str!("../../../../migrations/0004_operations.sql")),
    (5, "0005_operations_status", include_str!("../../../../migrations/0005_operations_status.sql")),
    (6, "0006_email", include_str!("../../../../migrations/0006_email.sql")),
    (7, "0007_callbacks_and_concurrency", include_str!("../../../../migrations/0007_callbacks_and_concurrency.sql")),
    (9, "0009_campaigns", include_str!("../../../../migrations/0009_campaigns.sql")),
    (10, "0010_fair_claims", include_str!("../../../../migrations/0010_fair_claims.sql")),
    (11, "0011_resend_backoff", include_str!("../../../../migrations/0011_resend_backoff.sql")),
    (12, "0012_tenant_faults", include_str!("../../../../migrations/0012_tenant_faults.sql")),
    (13, "0013_messages_recent", include_str!("../../../../migrations/0013_messages_recent.sql")),
    (14, "0014_message_previews", include_str!("../../../../migrations/0014_message_previews.sql")),
    (15, "0015_destinations", include_str!("../../../../migrations/0015_destinations.sql")),
    (16, "0016_completions", include_str!("../../../../migrations/0016_completions.sql")),
    (17, "0017_fan_out_in_constant_time", include_str!("../../../../migrations/0017_fan_out_in_constant_time.sql")),
    (
        18,
        "0018_job_keys_tenant_by_construction",
        include_str!("../../../../migrations/0018_job_keys_tenant_by_construction.sql"),
    ),
    (
        19,
        "0019_messages_tenant_by_construction",
        include_str!("../../../../migrations/0019_messages_tenant_by_construction.sql"),
    ),
    (20, "0020_job_terms_by_type", include_str!("../../../../migrations/0020_job_terms_by_type.sql")),
    (21, "0021_tenant_owned_switches", include_str!("../../../../migrations/0021_tenant_owned_switches.sql")),
    (22, "0022_job_fault", include_str!("../../../../migrations/0022_job_fault.sql")),
    (23, "0023_send_rates", include_str!("../../../../migrations/0023_send_rates.sql")),
    (24, "0024_admin_actions", include_str!("../../../../migrations/0024_admin_actions.sql")),
    (25, "0025_tenant_limits", include_str!("../../../../migrations/0025_tenant_limits.sql")),
    (27, "0027_message_event_callbacks", include_str!("../../../../migrations/0027_message_event_callbacks.sql")),
    (28, "0028_destination_url_patterns", include_str!("../../../../migrations/0028_destination_url_patterns.sql")),
    (29, "0029_job_dependencies", include_str!("../../../../migrations/0029_job_dependencies.sql")),
    (
        30,
        "0030_claims_write_fewer_index_entries",
        include_str!("../../../../migrations/0030_claims_write_fewer_index_entries.sql"),
    ),
    (31, "0031_destination_in_flight", include_str!("../../../../migrations/0031_destination_in_flight.sql")),
    (32, "0032_tenant_reputation", include_str!("../../../../migrations/0032_tenant_reputation.sql")),
    (33, "0033_send_shares", include_str!("../../../../migrations/0033_send_shares.sql")),
    (
        34,
        "0034_destination_tokens_signatures_success",
        include_str!("../../../../migrations/0034_destination_tokens_signatures_success.sql"),
    ),
    (36, "0036_ordering_keys", include_str!("../../../../migrations/0036_ordering_keys.sql")),
    (37, "0037_topic_opt_outs", include_str!("../../../../migrations/0037_topic_opt_outs.sql")),
    (38, "0038_cutover_stages", include_str!("../../../../migrations/0038_cutover_stages.sql")),
    (39, "0039_message_configuration_set", include_str!("../../../../migrations/0039_message_configuration_set.sql")),
    (40, "0040_topic_opt_out_limit", include_str!("../../../../migrations/0040_topic_opt_out_limit.sql")),
    (42, "0042_topic_ses_lists", include_str!("../../../../migrations/0042_topic_ses_lists.sql")),
    (43, "0043_ses_tenant_resources", include_str!("../../../../migrations/0043_ses_tenant_resources.sql")),
    (44, "0044_topic_ses_changes", include_str!("../../../../migrations/0044_topic_ses_changes.sql")),
];

/// Apply what is missing, in one transaction. Refuses to run when an applied migration's
/// text has changed: migrations are additive only.
pub async fn run(client: &mut deadpool_postgres::Client) -> Result<Vec<&'static str>, StoreError> {
    let tx = client.transaction().await?;
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(hashtext('relay_migrations:' || current_schema()));
         SET LOCAL client_min_messages = warning; -- no \"already exists, skipping\" notice at every start
         CREATE TABLE IF NOT EXISTS relay_migrations (
             version    integer PRIMARY KEY,
             name       text NOT NULL,
             checksum   bytea NOT NULL,
             applied_at timestamptz NOT NULL DEFAULT now()
         );
         RESET client_min_messages;",
    )
    .await?;
    let applied = tx.query("SELECT version, name, checksum FROM relay_migrations", &[]).await?;
    let mut done = Vec::new();
    for (version, name, sql) in MIGRATIONS {
        let checksum = Sha256::digest(sql.as_bytes()).to_vec();
        match applied.iter().find(|r| r.get::<_, i32>(0) == *version) {
            Some(row) if row.get::<_, Vec<u8>>(2) == checksum => continue,
            Some(_) => return Err(StoreError::MigrationEdited(name)),
            None => {}
        }
        tx.batch_execute(sql).await.map_err(|source| StoreError::Migration { name, source })?;
        tx.execute(
            "INSERT INTO relay_migrations (version, name, checksum) VALUES ($1, $2, $3)",
            &[version, name, &checksum],
        )
        .await?;
        done.push(*name);
    }
    tx.commit().await?;
    Ok(done)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// During a deploy the old version runs on the new schema (the hook migrates before the
    /// canary; a rollback does not un-migrate), so a migration may only add what it does not
    /// read: no dropped or renamed table, column, view, function or type, no changed column
    /// type, no column made NOT NULL, no new NOT NULL column an old INSERT would leave empty.
    /// (Dropping an index or a constraint only loosens; it is allowed.)
    #[test]
    fn migrations_only_add_so_the_old_version_runs_on_the_new_schema() {
        let forbidden = regex::Regex::new(
            r"(?i)\bDROP\s+(TABLE|COLUMN|VIEW|MATERIALIZED\s+VIEW|FUNCTION|TYPE|SCHEMA)\b|\bRENAME\b|\bALTER\s+COLUMN\s+\S+\s+(SET\s+DATA\s+)?TYPE\b|\bSET\s+NOT\s+NULL\b",
        )
        .expect("regex");
        let add_column = regex::Regex::new(r"(?is)\bADD\s+COLUMN\b[^,;]*").expect("regex");
        for (_, name, sql) in MIGRATIONS {
            let code: String =
                sql.lines().map(|l| l.split("--").next().unwrap_or_default()).collect::<Vec<_>>().join("\n");
            if let Some(m) = forbidden.find(&code) {
                panic!("{name}: {:?} breaks the version still running during a deploy", m.as_str());
            }
            for m in add_column.find_iter(&code) {
                let clause = m.as_str().split_whitespace().collect::<Vec<_>>().join(" ").to_ascii_uppercase();
                assert!(
                    !clause.contains("NOT NULL") || clause.contains("DEFAULT") || clause.contains("GENERATED"),
                    "{name}: {clause:?} needs a DEFAULT, or an old version's INSERT fails"
                );
            }
        }
        assert!(forbidden.is_match("ALTER TABLE jobs DROP COLUMN params"), "the check can fail");
        assert!(add_column.is_match("ALTER TABLE jobs ADD COLUMN x int NOT NULL"));
    }

    #[test]
    fn every_file_in_migrations_is_listed_in_order() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../migrations");
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .expect("migrations folder")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".sql"))
            .map(|n| n.trim_end_matches(".sql").to_owned())
            .collect();
        files.sort();
        let listed: Vec<&str> = MIGRATIONS.iter().map(|m| m.1).collect();
        assert_eq!(files, listed);
        // Numbers are assigned per branch, so a branch may hold 0004 before 0003 exists: the
        // versions must rise strictly and match each file's number.
        for w in MIGRATIONS.windows(2) {
            assert!(w[0].0 < w[1].0, "versions rise: {} then {}", w[0].0, w[1].0);
        }
        for m in MIGRATIONS {
            assert_eq!(m.1[..4].parse::<i32>().unwrap(), m.0, "{} has version {}", m.1, m.0);
        }
    }
}
