//! The cost of a job at the physical level, for Relay and for a peer alike: WAL bytes and
//! records per job for accept, claim and complete (pg_stat_statements, each statement classed
//! by its text), the total from the WAL position itself, heap tuples written per job
//! (pg_stat_user_tables of the run's schema) and index entries written per job (counted from
//! the WAL records with pg_walinspect; estimated from the heap writes when that WAL is gone),
//! with the entries and WAL bytes of each index of the schema.
//!
//! A run has two windows: accept (the jobs loaded, then ANALYZE) and processing (claim and
//! complete, interleaved). WAL splits by statement; the heap and index counters only by window.

use std::time::Duration;

use serde::Serialize;

use taskdeck::store::GenericClient;
use taskdeck::store::tooling::bench::{self, StatementClasses, StatementCost, TableWrites, WalRecords};

/// What the database had counted at one moment, for one system's schema.
#[derive(Debug, Clone)]
pub struct Reading {
    schema: String,
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
            schema: schema.to_owned(),
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
    /// The window's WAL by relation of the run's schema, most index entries first (empty when
    /// `index_entries` is estimated).
    pub relations: Vec<RelationWal>,
    pub tables: Vec<TableWrites>,
}

/// B-tree leaf records: each carries one new entry (a split, the one that did not fit).
const LEAF: [&str; 4] = ["Btree/INSERT_LEAF", "Btree/INSERT_POST", "Btree/SPLIT_L", "Btree/SPLIT_R"];

/// What one relation of the run's schema (a table or an index) took of a window's WAL, per job:
/// the records whose first block is the relation's. `(other)` is the rest: records of no block
/// (commits) and of relations elsewhere (catalogs, TOAST, other schemas and databases).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RelationWal {
    pub relation: String,
    /// B-tree leaf entries written (an index's).
    pub index_entries: f64,
    /// Heap and Heap2 records (a table's: inserts, updates, deletes, locks, pruning, …).
    pub heap_records: f64,
    pub records: f64,
    pub bytes: f64,
}

impl RelationWal {
    /// Per job, by relation, from the window's records.
    pub fn from_records(records: &[WalRecords], n: f64) -> Vec<RelationWal> {
        let mut out: Vec<RelationWal> = Vec::new();
        for r in records {
            let name = r.relation.as_deref().unwrap_or("(other)");
            let at = match out.iter().position(|x| x.relation == name) {
                Some(i) => i,
                None => {
                    out.push(RelationWal { relation: name.to_owned(), ..RelationWal::default() });
                    out.len() - 1
                }
            };
            let x = &mut out[at];
            let count = r.count as f64 / n;
            if LEAF.contains(&r.kind.as_str()) {
                x.index_entries += count;
            }
            if r.kind.starts_with("Heap/") || r.kind.starts_with("Heap2/") {
                x.heap_records += count;
            }
            x.records += count;
            x.bytes += r.bytes as f64 / n;
        }
        out.sort_by(|a, b| b.index_entries.total_cmp(&a.index_entries).then(b.bytes.total_cmp(&a.bytes)));
        out
    }
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
        match bench::wal_records_between(db, &after.schema, before.wal, after.wal).await? {
            Some(records) => {
                w.relations = RelationWal::from_records(&records, n);
                w.index_entries = w.relations.iter().map(|r| r.index_entries).sum();
                w.index_counted = true;
                for r in &records {
                    match w.records.iter_mut().find(|k| k.0 == r.kind) {
                        Some(k) => (k.1, k.2) = (k.1 + r.count as f64 / n, k.2 + r.bytes as f64 / n),
                        None => w.records.push((r.kind.clone(), r.count as f64 / n, r.bytes as f64 / n)),
                    }
                }
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

    /// The indexes that got at least 0.01 entries per job: name, then entries (WAL bytes).
    fn per_index(&self) -> Vec<(String, String)> {
        let shown = self.relations.iter().filter(|r| r.index_entries >= 0.01);
        shown.map(|r| (r.relation.clone(), format!("{:.2} ({:.0} B)", r.index_entries, r.bytes))).collect()
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

/// Issue 34's targets for a job's writes: total WAL per job (accept, claim and complete), and
/// index entries per claim + complete.
const TARGET_WAL_BYTES: &str = "1,100";
const TARGET_PROCESSING_ENTRIES: u32 = 3;

/// One window's writes of a run's cost.
type WindowOf = fn(&JobCost) -> &Writes;

/// The per-job cost table: rows accept / claim / complete / other / total, then the heap and
/// index writes of each window, each window's entries under it by index (those with at least
/// 0.01 a job); Relay in the value column, the peer (when it ran) in the note.
pub fn lines(label: &str, relay: &JobCost, peer: Option<(&str, &JobCost)>) -> Vec<String> {
    let mut out =
        vec![super::line("cost", &format!("per job ({label}): WAL (records)"), "Relay", peer.map_or("", |p| p.0))];
    let mut both = |name: &str, target: Option<String>, f: &dyn Fn(&JobCost) -> String| {
        let note = note(target, peer.map(|(p, c)| format!("{p}: {}", f(c))));
        out.push(super::line("cost", &format!("  {name}"), &f(relay), &note));
    };
    let wal = |w: Option<Wal>| w.map_or("n/a".to_string(), |w| w.show());
    both("accept", None, &|c| wal(c.accept));
    both("claim", None, &|c| wal(c.claim));
    both("complete", None, &|c| wal(c.complete));
    both("other (commits, reads)", None, &|c| wal(c.other));
    let wal_target = format!("target ≤ {TARGET_WAL_BYTES} B");
    both("total (WAL position)", Some(wal_target), &|c| format!("{:.0} B", c.total_wal_bytes));
    both("heap ins/upd(HOT)/del: accept", None, &|c| c.accept_window.heap());
    both("heap ins/upd(HOT)/del: claim+complete", None, &|c| c.processing_window.heap());
    let accept: WindowOf = |c| &c.accept_window;
    let processing: WindowOf = |c| &c.processing_window;
    let entries_target = format!("target ≤ {TARGET_PROCESSING_ENTRIES}");
    for (name, window, target) in [("accept", accept, None), ("claim+complete", processing, Some(entries_target))] {
        let note = note(target, peer.map(|(p, c)| format!("{p}: {}", window(c).index())));
        out.push(super::line("cost", &format!("  index entries: {name}"), &window(relay).index(), &note));
        // Relay's indexes and the peer's side by side, each most entries first.
        let ours = window(relay).per_index();
        let theirs = peer.map(|(p, c)| (p, window(c).per_index()));
        for i in 0..ours.len().max(theirs.as_ref().map_or(0, |t| t.1.len())) {
            let (name, value) = ours.get(i).cloned().unwrap_or_default();
            let note = theirs.as_ref().and_then(|(p, t)| t.get(i).map(|(i, v)| format!("{p}: {i} {v}")));
            out.push(super::line("cost", &format!("    {name}"), &value, &note.unwrap_or_default()));
        }
    }
    out
}

/// A cost row's note: its target, then the peer's figure, each when there is one.
fn note(target: Option<String>, peer: Option<String>) -> String {
    target.into_iter().chain(peer).collect::<Vec<_>>().join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(relation: Option<&str>, kind: &str, count: i64, bytes: i64) -> WalRecords {
        WalRecords { relation: relation.map(str::to_owned), kind: kind.into(), count, bytes }
    }

    #[test]
    fn relations_count_leaf_entries_and_heap_records_per_job() {
        let records = [
            rec(Some("jobs"), "Heap/INSERT", 10, 1000),
            rec(Some("jobs"), "Heap2/PRUNE", 2, 100),
            rec(Some("jobs_pkey"), "Btree/INSERT_LEAF", 9, 600),
            rec(Some("jobs_pkey"), "Btree/SPLIT_R", 1, 200),
            rec(Some("jobs_pkey"), "Btree/INSERT_UPPER", 1, 50),
            rec(Some("jobs_due"), "Btree/INSERT_POST", 5, 300),
            rec(None, "Transaction/COMMIT", 10, 340),
        ];
        let r = RelationWal::from_records(&records, 10.0);
        let names: Vec<&str> = r.iter().map(|r| r.relation.as_str()).collect();
        assert_eq!(names, ["jobs_pkey", "jobs_due", "jobs", "(other)"]);
        assert_eq!((r[0].index_entries, r[0].records, r[0].bytes), (1.0, 1.1, 85.0));
        assert_eq!((r[2].heap_records, r[2].index_entries, r[2].bytes), (1.2, 0.0, 110.0));
        assert_eq!((r[3].records, r[3].index_entries), (1.0, 0.0));
    }
}
