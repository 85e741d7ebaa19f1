//! The cost of a job at the physical level, for Relay and for a peer alike: WAL bytes and
//! records per job for accept, claim and complete (pg_stat_statements, each statement classed
//! by its text), the total from the WAL position itself, heap tuples written per job
//! (pg_stat_user_tables of the run's schema) and index entries written per job (counted from
//! the WAL records with pg_walinspect; estimated from the heap writes when that WAL is gone).
//!
//! A run has two windows: accept (the jobs loaded, then ANALYZE) and processing (claim and
//! complete, interleaved). WAL splits by statement; the heap and index counters only by window.

use std::time::Duration;

use serde::Serialize;

use taskdeck::store::GenericClient;
use taskdeck::store::tooling::bench::{self, StatementClasses, StatementCost, TableWrites};

/// What the database had counted at one moment, for one system's schema.
#[derive(Debug, Clone)]
pub struct Reading {
    wal: i64,
    statements: Option<(StatementCost, [StatementCost; 3])>,
    tables: Vec<TableWrites>,
}

impl Reading {
    /// Backends flush their statistics at most once a second (and when they exit): wait that
    /// long first, so the reading holds what the window did.
    pub async fn take(db: &impl GenericClient, schema: &str, classes: &StatementClasses) -> anyhow::Result<Reading> {
        tokio::time::sleep(Duration::from_millis(1100)).await;
        Ok(Reading {
            wal: bench::wal_position(db).await?,
            statements: bench::statement_costs(db, classes).await?,
            tables: bench::table_writes(db, schema).await?,
        })
    }
}

/// WAL per job of one class of statements.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Wal {
    pub bytes: f64,
    pub records: f64,
    pub fpi: f64,
}

impl Wal {
    fn between(before: StatementCost, after: StatementCost, n: f64) -> Wal {
        Wal {
            bytes: (after.wal_bytes - before.wal_bytes) as f64 / n,
            records: (after.wal_records - before.wal_records) as f64 / n,
            fpi: (after.wal_fpi - before.wal_fpi) as f64 / n,
        }
    }

    fn show(&self) -> String {
        format!("{:.0} B ({:.1})", self.bytes, self.records)
    }
}

/// Heap tuples and index entries one window wrote, per job.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Writes {
    /// WAL bytes per job between the window's two positions (everything, classed or not).
    pub wal_bytes: f64,
    pub inserted: f64,
    pub updated: f64,
    pub hot_updated: f64,
    pub deleted: f64,
    /// B-tree leaf entries written per job.
    pub index_entries: f64,
    /// True when `index_entries` was counted from the WAL; false when estimated as every
    /// insert and non-HOT update times its table's indexes (partial indexes counted as matched).
    pub index_counted: bool,
    /// WAL record types of the window (pg_walinspect): records and bytes per job.
    pub records: Vec<(String, f64, f64)>,
    pub tables: Vec<TableWrites>,
}

impl Writes {
    async fn between(db: &impl GenericClient, before: &Reading, after: &Reading, n: f64) -> anyhow::Result<Writes> {
        let mut w = Writes { wal_bytes: (after.wal - before.wal) as f64 / n, ..Writes::default() };
        let mut estimate = 0.0;
        for t in &after.tables {
            let b = before.tables.iter().find(|b| b.table == t.table).cloned().unwrap_or_default();
            let d = TableWrites {
                table: t.table.clone(),
                inserted: t.inserted - b.inserted,
                updated: t.updated - b.updated,
                hot_updated: t.hot_updated - b.hot_updated,
                deleted: t.deleted - b.deleted,
                indexes: t.indexes,
            };
            w.inserted += d.inserted as f64 / n;
            w.updated += d.updated as f64 / n;
            w.hot_updated += d.hot_updated as f64 / n;
            w.deleted += d.deleted as f64 / n;
            estimate += ((d.inserted + d.updated - d.hot_updated) * d.indexes) as f64 / n;
            if d.inserted + d.updated + d.deleted > 0 {
                w.tables.push(d);
            }
        }
        match bench::wal_records_between(db, before.wal, after.wal).await? {
            Some(records) => {
                let leaf = ["Btree/INSERT_LEAF", "Btree/INSERT_POST", "Btree/SPLIT_L", "Btree/SPLIT_R"];
                w.index_entries =
                    records.iter().filter(|r| leaf.contains(&r.0.as_str())).map(|r| r.1 as f64).sum::<f64>() / n;
                w.index_counted = true;
                w.records = records
                    .into_iter()
                    .map(|(kind, count, bytes)| (kind, count as f64 / n, bytes as f64 / n))
                    .collect();
                w.records.sort_by(|a, b| b.2.total_cmp(&a.2));
            }
            None => w.index_entries = estimate,
        }
        Ok(w)
    }

    fn heap(&self) -> String {
        format!("{:.2}/{:.2}({:.2})/{:.2}", self.inserted, self.updated, self.hot_updated, self.deleted)
    }

    fn index(&self) -> String {
        format!("{}{:.2}", if self.index_counted { "" } else { "≈" }, self.index_entries)
    }
}

/// One system's cost per job over a run: accept, claim, complete.
#[derive(Debug, Clone, Default, Serialize)]
pub struct JobCost {
    pub jobs: usize,
    /// By statement class (`None` without pg_stat_statements).
    pub accept: Option<Wal>,
    pub claim: Option<Wal>,
    pub complete: Option<Wal>,
    /// Statements in no class: transaction control, commit records, ANALYZE, reads.
    pub other: Option<Wal>,
    /// From the WAL position over both windows: every byte, classed or not.
    pub total_wal_bytes: f64,
    pub accept_window: Writes,
    pub processing_window: Writes,
}

impl JobCost {
    /// The cost between three readings: before the jobs were loaded, after (the accept
    /// window), and after they were processed.
    pub async fn between(
        db: &impl GenericClient,
        jobs: usize,
        r0: &Reading,
        r1: &Reading,
        r2: &Reading,
    ) -> anyhow::Result<JobCost> {
        let n = jobs.max(1) as f64;
        let phase = |i: usize| r2.statements.zip(r0.statements).map(|(a, b)| Wal::between(b.1[i], a.1[i], n));
        let other = r2.statements.zip(r0.statements).map(|(a, b)| {
            let all = Wal::between(b.0, a.0, n);
            let classed: Vec<Wal> = (0..3).map(|i| Wal::between(b.1[i], a.1[i], n)).collect();
            Wal {
                bytes: all.bytes - classed.iter().map(|c| c.bytes).sum::<f64>()
                    + ((r2.wal - r0.wal) as f64 / n - all.bytes),
                records: all.records - classed.iter().map(|c| c.records).sum::<f64>(),
                fpi: all.fpi - classed.iter().map(|c| c.fpi).sum::<f64>(),
            }
        });
        Ok(JobCost {
            jobs,
            accept: phase(0),
            claim: phase(1),
            complete: phase(2),
            other,
            total_wal_bytes: (r2.wal - r0.wal) as f64 / n,
            accept_window: Writes::between(db, r0, r1, n).await?,
            processing_window: Writes::between(db, r1, r2, n).await?,
        })
    }
}

/// The per-job cost table: rows accept / claim / complete / other / total, then the heap and
/// index writes of each window; Relay in the value column, the peer (when it ran) in the note.
pub fn lines(label: &str, relay: &JobCost, peer: Option<(&str, &JobCost)>) -> Vec<String> {
    let mut out =
        vec![super::line("cost", &format!("per job ({label}): WAL (records)"), "Relay", peer.map_or("", |p| p.0))];
    let mut both = |name: &str, f: &dyn Fn(&JobCost) -> String| {
        let note = peer.map_or(String::new(), |(p, c)| format!("{p}: {}", f(c)));
        out.push(super::line("cost", &format!("  {name}"), &f(relay), &note));
    };
    let wal = |w: Option<Wal>| w.map_or("n/a".to_string(), |w| w.show());
    both("accept", &|c| wal(c.accept));
    both("claim", &|c| wal(c.claim));
    both("complete", &|c| wal(c.complete));
    both("other (commits, reads)", &|c| wal(c.other));
    both("total (WAL position)", &|c| format!("{:.0} B", c.total_wal_bytes));
    both("heap ins/upd(HOT)/del: accept", &|c| c.accept_window.heap());
    both("heap ins/upd(HOT)/del: claim+complete", &|c| c.processing_window.heap());
    both("index entries: accept", &|c| c.accept_window.index());
    both("index entries: claim+complete", &|c| c.processing_window.index());
    out
}
