//! The operator commands of `relay`: operators, exceptions, modes, schedules, tenant keys and
//! sending identities, and the OpenAPI document. They call the store (and the same action code as the API) directly
//! against DATABASE_URL; each audit row names `--as` (default `cli:$USER`).

use anyhow::{Context, bail};
use chrono::{DateTime, Utc};
use clap::Subcommand;
use serde_json::{Value, json};
use taskdeck::exceptions::{self as actions, Action};
use taskdeck::platform::Platform;
use taskdeck::schedules::{self, SchedulePatch, ScheduleSpec};
use taskdeck::store::exceptions::{self, ExceptionFilter, ExceptionStatus};
use taskdeck::store::jobs::operator;
use taskdeck::store::{modes, operators, schedules as schedule_store, sending_identities, tenants};
use taskdeck::view::JobView;
use uuid::Uuid;

#[derive(Subcommand)]
pub enum OperatorCommand {
    /// Create an operator; prints only its new key on stdout.
    Create { name: String },
    /// Issue a new key (the old one stops working); prints only the new key.
    Rotate { name: String },
    /// Disable an operator's key.
    Revoke { name: String },
}

/// `--status`: one of the exception statuses, by name.
fn exception_status() -> impl clap::builder::TypedValueParser<Value = ExceptionStatus> {
    use clap::builder::TypedValueParser as _;
    clap::builder::PossibleValuesParser::new(ExceptionStatus::ALL.map(ExceptionStatus::as_str))
        .try_map(|s| ExceptionStatus::parse(&s).ok_or("not an exception status"))
}

#[derive(Subcommand)]
pub enum ExceptionsCommand {
    /// List exceptions, newest first (JSON).
    List {
        #[arg(long, value_parser = exception_status())]
        status: Option<ExceptionStatus>,
        #[arg(long)]
        kind: Option<String>,
        #[arg(long)]
        task_type: Option<String>,
        /// A tenant's name.
        #[arg(long)]
        tenant: Option<String>,
        /// A substring of the cause.
        #[arg(long)]
        cause: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: i64,
    },
    /// One exception with its job, history and audit (JSON).
    Show { id: Uuid },
    /// Retry the failed job now, or at `--at`.
    Retry {
        id: Uuid,
        /// RFC 3339 time.
        #[arg(long)]
        at: Option<DateTime<Utc>>,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Cancel the job, its pending children and its schedule's future runs.
    Cancel {
        id: Uuid,
        #[arg(long)]
        reason: Option<String>,
    },
    /// Mark the failed job succeeded (a reason is required).
    Finish {
        id: Uuid,
        #[arg(long)]
        reason: String,
    },
    /// Close the exception as ignored (a reason is required).
    Ignore {
        id: Uuid,
        #[arg(long)]
        reason: String,
    },
}

#[derive(Subcommand)]
pub enum ModesCommand {
    /// Print the switches set in the table and the effective shadow mode.
    Get,
    /// Set a switch: `shadow`, `write:<integration>` or `pause:<task type>`, to on or off.
    Set {
        name: String,
        #[arg(value_parser = ["on", "off"])]
        value: String,
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Subcommand)]
pub enum SchedulesCommand {
    /// Every schedule with last run, last outcome and next run (JSON).
    List,
    /// Create a schedule.
    Add {
        name: String,
        #[arg(long)]
        task: String,
        /// Cron expression (5 fields, or 6 with seconds first).
        #[arg(long)]
        cron: String,
        #[arg(long, default_value = "UTC")]
        timezone: String,
        /// Task params as JSON.
        #[arg(long, default_value = "{}")]
        params: String,
        /// Owner of the fired jobs (default: the platform tenant).
        #[arg(long)]
        tenant: Option<String>,
        /// Fire every slot missed during downtime.
        #[arg(long)]
        catch_up: bool,
    },
    /// Stop firing.
    Pause { name: String },
    /// Fire again from the next slot (slots passed while paused do not fire).
    Resume { name: String },
}

#[derive(Subcommand)]
pub enum TenantKeyCommand {
    /// Issue a new API key (the old one stops working); prints only the new key.
    Rotate { name: String },
    /// Disable the tenant: its key stops working.
    Revoke { name: String },
    /// The tenant's id (what RELAY_TENANT_TASK_ROLES is keyed by) and sending identities (JSON).
    Show { name: String },
    /// Replace the tenant's sending identities (addresses or domains) with those given.
    Identities {
        name: String,
        #[arg(required = true)]
        identities: Vec<String>,
    },
}

fn print(v: &impl serde::Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

pub async fn operator(p: &Platform, cmd: OperatorCommand) -> anyhow::Result<()> {
    let db = p.pool.get().await?;
    match cmd {
        OperatorCommand::Create { name } => {
            if !operators::valid_name(&name) {
                bail!("an operator name is 1 to 100 letters, digits or `_.@:-`");
            }
            let (_, key) = operators::create(&db, &name).await.context("is the name taken?")?;
            println!("{key}");
        }
        OperatorCommand::Rotate { name } => {
            let key = operators::rotate_key(&db, &name)
                .await?
                .with_context(|| format!("no enabled operator named {name:?}"))?;
            println!("{key}");
        }
        OperatorCommand::Revoke { name } => {
            if !operators::revoke(&db, &name).await? {
                bail!("no enabled operator named {name:?}");
            }
            eprintln!("operator {name:?} revoked");
        }
    }
    Ok(())
}

pub async fn exceptions(p: &Platform, actor: &str, cmd: ExceptionsCommand) -> anyhow::Result<()> {
    let act = |id, action: Action, reason: Option<String>| async move {
        let out = actions::act(&p.pool, &p.transport, id, &action, reason.as_deref(), actor, Utc::now()).await?;
        print(&out)
    };
    match cmd {
        ExceptionsCommand::List { status, kind, task_type, tenant, cause, limit } => {
            let db = p.pool.get().await?;
            let tenant_id = match tenant {
                None => None,
                Some(name) => {
                    Some(tenants::by_name(&db, &name).await?.with_context(|| format!("no tenant named {name:?}"))?.id)
                }
            };
            let f =
                ExceptionFilter { status, kind, task_type, tenant_id, cause, before: None, limit: limit.clamp(1, 500) };
            print(&exceptions::list(&db, &f).await?)
        }
        ExceptionsCommand::Show { id } => {
            let db = p.pool.get().await?;
            let e = exceptions::get(&db, id).await?.context("no such exception")?;
            print(&json!({
                "job": operator::get_any(&db, e.job_id).await?.map(JobView::bare),
                "events": operator::events_any(&db, e.job_id).await?,
                "actions": exceptions::actions(&db, id).await?,
                "exception": e,
            }))
        }
        ExceptionsCommand::Retry { id, at, reason } => act(id, Action::Retry { at }, reason).await,
        ExceptionsCommand::Cancel { id, reason } => act(id, Action::Cancel, reason).await,
        ExceptionsCommand::Finish { id, reason } => act(id, Action::Finish { result: None }, Some(reason)).await,
        ExceptionsCommand::Ignore { id, reason } => act(id, Action::Ignore, Some(reason)).await,
    }
}

pub async fn modes(p: &Platform, actor: &str, cmd: ModesCommand) -> anyhow::Result<()> {
    let mut db = p.pool.get().await?;
    if let ModesCommand::Set { name, value, reason } = cmd {
        taskdeck::api::admin::check_mode_name(&name, &p.catalogue).map_err(|e| anyhow::anyhow!(e.message))?;
        modes::set(&mut db, &name, value == "on", actor, reason.as_deref()).await?;
    }
    let m = modes::load(&db).await?;
    print(&json!({ "switches": m.switches, "shadow": m.shadow() }))
}

pub async fn schedules(p: &Platform, actor: &str, cmd: SchedulesCommand) -> anyhow::Result<()> {
    let mut db = p.pool.get().await?;
    let by_name = |name: String| async move {
        let db = p.pool.get().await?;
        schedule_store::by_name(&db, &name).await?.with_context(|| format!("no schedule named {name:?}"))
    };
    match cmd {
        SchedulesCommand::List => print(&schedule_store::list(&db).await?),
        SchedulesCommand::Add { name, task, cron, timezone, params, tenant, catch_up } => {
            let params: Value = serde_json::from_str(&params).context("--params is not JSON")?;
            let spec = ScheduleSpec { name, task_type: task, params, cron, timezone, tenant, enabled: true, catch_up };
            print(&schedules::add(&db, &p.catalogue, spec, actor, Utc::now()).await?)
        }
        SchedulesCommand::Pause { name } => {
            let s = by_name(name).await?;
            let patch = SchedulePatch { enabled: Some(false), ..Default::default() };
            print(&schedules::change(&mut db, &p.catalogue, s.id, patch, actor, Utc::now()).await?)
        }
        SchedulesCommand::Resume { name } => {
            let s = by_name(name).await?;
            let patch = SchedulePatch { enabled: Some(true), ..Default::default() };
            print(&schedules::change(&mut db, &p.catalogue, s.id, patch, actor, Utc::now()).await?)
        }
    }
}

pub async fn tenant_key(p: &Platform, cmd: TenantKeyCommand) -> anyhow::Result<()> {
    let db = p.pool.get().await?;
    match cmd {
        TenantKeyCommand::Rotate { name } => {
            let t = tenants::by_name(&db, &name).await?.with_context(|| format!("no tenant named {name:?}"))?;
            println!("{}", tenants::rotate_key(&db, t.id).await?);
        }
        TenantKeyCommand::Revoke { name } => {
            if !tenants::revoke(&db, &name).await? {
                bail!("no enabled tenant named {name:?}");
            }
            eprintln!("tenant {name:?} revoked (cached keys stop working within 10 s)");
        }
        TenantKeyCommand::Show { name } => {
            let t = tenants::by_name(&db, &name).await?.with_context(|| format!("no tenant named {name:?}"))?;
            let identities = sending_identities::list(&db, t.id).await?;
            print(&json!({ "id": t.id, "name": t.name, "sending_identities": identities }))?;
        }
        TenantKeyCommand::Identities { name, identities } => {
            if let Some(bad) = identities.iter().find(|i| !taskdeck::email::content::valid_identity(i)) {
                bail!("{bad:?} is not an address or a domain");
            }
            let t = tenants::by_name(&db, &name).await?.with_context(|| format!("no tenant named {name:?}"))?;
            drop(db);
            let set = sending_identities::set(&mut p.pool.get().await?, t.id, &identities).await?;
            print(&json!({ "id": t.id, "name": t.name, "sending_identities": set }))?;
        }
    }
    Ok(())
}
