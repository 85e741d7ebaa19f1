//! `relay`: the operator CLI and local runner. `relay dev` runs the whole platform in one
//! process; the other commands run one part each against a shared database, and the
//! operator commands (`ops`) act on exceptions, modes, schedules and keys.

/// The commands that need more than a few lines each.
mod cli {
    pub mod dev;
    pub mod ingress;
    pub mod jobs;
    pub mod ops;
    pub mod smoke;
}

use cli::{dev, ingress, jobs, ops, smoke};

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};
use relay::pgcluster::{Durability, PrivateCluster};
use taskdeck::alerts::AlertConfig;
use taskdeck::config::{LEASE_SECONDS, LOCAL_LEASE_SECONDS, RETENTION_DAYS, limit_setting};
use taskdeck::limits::Kind;
use taskdeck::platform::{Platform, Settings};
use taskdeck::store::tenants;
use tokio::sync::watch;

#[derive(Parser)]
#[command(name = "relay", version, about = "Relay: durable background jobs for client services")]
struct Cli {
    /// Postgres URL. `relay dev` boots a private cluster when it is not set; the other
    /// commands then use the one `relay dev` recorded in its data dir.
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    /// Folder of the private Postgres cluster (`relay dev`: .relay/pg, where the other
    /// commands find its database; `bench`: .relay/bench-pg; `chaos`: .relay/chaos-pg).
    #[arg(long, env = "RELAY_DATA_DIR", global = true)]
    data_dir: Option<PathBuf>,
    /// Who the audit rows of operator commands name (default `cli:$USER`).
    #[arg(long = "as", env = "RELAY_OPERATOR", global = true)]
    operator: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(clap::Args, Clone)]
struct Run {
    /// Worker loops in this process.
    #[arg(long, env = "RELAY_WORKERS", default_value_t = 2)]
    workers: usize,
    /// Jobs each worker loop runs at once.
    #[arg(long, env = "RELAY_CONCURRENCY", default_value_t = 64)]
    concurrency: usize,
    /// Slots of each worker loop that long jobs may hold (the long lane; default half of
    /// `--concurrency`, at least 1).
    #[arg(long, env = "RELAY_LONG_LANE_SLOTS", value_parser = clap::value_parser!(u32).range(1..))]
    long_lane_slots: Option<u32>,
    /// A job whose `timeout_seconds` exceeds this is long: it runs in the long lane.
    #[arg(long, env = "RELAY_LONG_JOB_SECONDS", default_value_t = taskdeck::executor::DEFAULT_LONG_AFTER,
          value_parser = clap::value_parser!(i32).range(1..))]
    long_job_seconds: i32,
    /// Lease length in seconds, 3 to 43200 (a heartbeat renews it for long jobs).
    #[arg(long, env = LEASE_SECONDS.name, default_value_t = LOCAL_LEASE_SECONDS, value_parser = LEASE_SECONDS.parser())]
    lease_seconds: u64,
    /// Seconds between sweep passes.
    #[arg(long, env = "RELAY_SWEEP_INTERVAL_SECONDS", default_value_t = 30)]
    sweep_interval_seconds: u64,
    /// Tasks that coalesce concurrent small submissions into multi-row inserts (each holds
    /// one connection while it writes).
    #[arg(long, env = "RELAY_INTAKE_WRITERS", default_value_t = 1)]
    intake_writers: usize,
    /// Database connections in this process's pool (default: 8 + 2 per worker loop).
    #[arg(long, env = "RELAY_POOL_SIZE")]
    pool_size: Option<usize>,
    /// Database connections the API and the intake keep to themselves, apart from the pool
    /// (0: they share it).
    #[arg(long, env = "RELAY_API_POOL_SIZE", default_value_t = 4)]
    api_pool_size: usize,
    /// Register the test-only tasks (`test.fail`, `test.effect`). Never in production.
    #[arg(long, env = "RELAY_TEST_TASKS", value_parser = clap::builder::BoolishValueParser::new())]
    test_tasks: bool,
    /// CIDRs and host names callbacks may reach although the address guard refuses them
    /// (comma-separated; e.g. `127.0.0.1/32` for a receiver on this machine).
    #[arg(long, env = "RELAY_CALLBACK_ALLOW", value_parser = taskdeck::outbound::AllowList::parse)]
    callback_allow: Option<taskdeck::outbound::AllowList>,
    /// Jobs per second each tenant may submit to this API process (429 beyond); unset: no limit.
    #[arg(long, env = "RELAY_TENANT_RATE")]
    tenant_rate: Option<f64>,
    /// Jobs a tenant may submit at once (the bucket's size; default: one second's worth, at least 1).
    #[arg(long, env = "RELAY_TENANT_BURST")]
    tenant_burst: Option<f64>,
    /// HTTP destinations each tenant may have, unless an operator overrides it (0 to 10^9).
    #[arg(long, env = limit_setting(Kind::Destinations).name, default_value_t = limit_setting(Kind::Destinations).default, value_parser = limit_setting(Kind::Destinations).parser())]
    limit_destinations: u64,
    /// Email templates each tenant may have, unless an operator overrides it.
    #[arg(long, env = limit_setting(Kind::Templates).name, default_value_t = limit_setting(Kind::Templates).default, value_parser = limit_setting(Kind::Templates).parser())]
    limit_templates: u64,
    /// Suppressions each tenant may have (adding one by hand past it is refused).
    #[arg(long, env = limit_setting(Kind::Suppressions).name, default_value_t = limit_setting(Kind::Suppressions).default, value_parser = limit_setting(Kind::Suppressions).parser())]
    limit_suppressions: u64,
    #[arg(long, env = limit_setting(Kind::TopicOptOuts).name, default_value_t = limit_setting(Kind::TopicOptOuts).default, value_parser = limit_setting(Kind::TopicOptOuts).parser())]
    limit_topic_opt_outs: u64,
    /// Unfinished jobs each tenant may have (submitting past it answers 429).
    #[arg(long, env = limit_setting(Kind::PendingJobs).name, default_value_t = limit_setting(Kind::PendingJobs).default, value_parser = limit_setting(Kind::PendingJobs).parser())]
    limit_pending_jobs: u64,
}

/// A limit as read (at most `limits::MAX_LIMIT`, which fits).
fn limit(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(taskdeck::limits::MAX_LIMIT)
}

impl Run {
    fn settings(&self) -> anyhow::Result<Settings> {
        let mut s = Settings::default();
        s.executor.concurrency = self.concurrency.max(1);
        s.executor.claim_batch = self.concurrency.clamp(1, 1000);
        s.executor.long_lane = Some(taskdeck::executor::LaneSplit {
            long_after: self.long_job_seconds,
            long_slots: self.long_lane_slots.map(|n| n as usize),
        });
        s.executor.lease = Duration::from_secs(self.lease_seconds);
        s.sweep_interval = Duration::from_secs(self.sweep_interval_seconds.max(1));
        s.test_tasks = self.test_tasks;
        s.intake_writers = self.intake_writers.max(1);
        s.callback_allow = self.callback_allow.clone().unwrap_or_default();
        s.tenant_rate = self.tenant_rate.filter(|r| *r > 0.0).map(|per_second| taskdeck::api::ratelimit::TenantRate {
            per_second,
            burst: self.tenant_burst.unwrap_or(per_second).max(1.0),
        });
        s.tenant_limits = taskdeck::limits::Defaults {
            destinations: limit(self.limit_destinations),
            templates: limit(self.limit_templates),
            suppressions: limit(self.limit_suppressions),
            topic_opt_outs: limit(self.limit_topic_opt_outs),
            pending_jobs: limit(self.limit_pending_jobs),
        };
        s.pool.max_size = self.pool_size.unwrap_or(8 + 2 * self.workers).max(1);
        s.api_pool_size = Some(self.api_pool_size).filter(|n| *n > 0);
        s.sweep.alerts = AlertConfig::from_lookup(|k| std::env::var(k).ok())?;
        Ok(s)
    }
}

#[derive(Subcommand)]
enum Command {
    /// The whole platform in one process: API, workers, sweep, console (private Postgres unless DATABASE_URL).
    Dev {
        #[arg(long, env = "RELAY_ADDR", default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
        /// Where the console watching this instance listens.
        #[arg(long, env = "RELAY_CONSOLE_ADDR", default_value = "127.0.0.1:8090")]
        console_addr: SocketAddr,
        /// Send email to a local SES (moto behind a stand-in) that allows RATE sends a second and
        /// throttles beyond, instead of the AWS the environment names; sends are paced at RATE.
        #[arg(long, env = "RELAY_DEV_LOCAL_SES", value_name = "RATE",
              value_parser = clap::value_parser!(u32).range(1..=1000))]
        local_ses: Option<u32>,
        #[command(flatten)]
        run: Run,
    },
    /// Apply pending migrations, ensure the built-in schedules, and exit.
    Migrate {
        /// Days the built-in retention schedule keeps terminal jobs, when it is created.
        #[arg(long, env = RETENTION_DAYS.name, default_value_t = RETENTION_DAYS.default, value_parser = RETENTION_DAYS.parser())]
        retention_days: u64,
    },
    /// Serve the HTTP API only.
    Serve {
        #[arg(long, env = "RELAY_ADDR", default_value = "127.0.0.1:8080")]
        addr: SocketAddr,
        #[command(flatten)]
        run: Run,
    },
    /// Run workers only.
    Worker {
        #[command(flatten)]
        run: Run,
    },
    /// Run one sweep pass (or keep sweeping with --loop).
    Sweep {
        #[arg(long = "loop")]
        keep_going: bool,
        #[command(flatten)]
        run: Run,
    },
    /// Measure Relay beside the physical limit of the same database; prints a table, writes JSON.
    Bench {
        /// Smaller job counts (for a quick look, not for the record).
        #[arg(long)]
        quick: bool,
        /// Repeat each measurement this many times and report the median.
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// Where to write the JSON report.
        #[arg(long, default_value = "target/bench/relay-bench.json")]
        out: PathBuf,
        /// Run only the named sections (probe, intake, processing, latency, sweep, campaign, pace, lambda).
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// The `pace` section's account rate, sends a second (the SES stand-in throttles above it).
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u32).range(1..=1000))]
        pace_rate: u32,
        /// Also run a peer job queue (graphile-worker) against the same database, alternating
        /// with Relay's runs, and print the ratio per cell. Installed from npm on first use.
        #[arg(long)]
        peer: Option<String>,
    },
    /// Run a chaos scenario (or `all`): faults injected into real processes; prints figures,
    /// writes JSON, exits non-zero on a violation of Relay's guarantees.
    Chaos {
        /// kill9, duplicates, lost-dispatch, zombie, db-outage, queue-outage, poison,
        /// idempotency, isolation, auth, noisy, fuzz — or all.
        scenario: String,
        /// 1.0 = the sizes and durations of the issue; smaller for a quick look.
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
        /// Folder for the JSON reports.
        #[arg(long, default_value = "target/chaos")]
        out: PathBuf,
        /// Folder for venvs (moto, schemathesis), logs and the outage scenario's own cluster.
        #[arg(long, default_value = "target/tmp")]
        tmp: PathBuf,
    },
    /// Manage tenants.
    Tenant {
        #[command(subcommand)]
        command: TenantCommand,
    },
    /// Manage operators (their keys call `/v1/admin`).
    Operator {
        #[command(subcommand)]
        command: ops::OperatorCommand,
    },
    /// List, show and act on exceptions.
    Exceptions {
        #[command(subcommand)]
        command: ops::ExceptionsCommand,
    },
    /// Read or set operating modes.
    Modes {
        #[command(subcommand)]
        command: ops::ModesCommand,
    },
    /// List, add, pause and resume schedules.
    Schedules {
        #[command(subcommand)]
        command: ops::SchedulesCommand,
    },
    /// Print the OpenAPI 3.1 document of the API (needs no database).
    Openapi,
    /// Manage read-only status keys (for GET /v1/status and the console).
    StatusKey {
        #[command(subcommand)]
        command: StatusKeyCommand,
    },
    /// Serve the console: polls each project's status contract (no database).
    Console {
        #[arg(long, env = "RELAY_CONSOLE_ADDR", default_value = "127.0.0.1:8090")]
        addr: SocketAddr,
        /// JSON file: {"projects": [{"name", "status_url", "token"}], "timeout_seconds"?, "refresh_seconds"?}
        #[arg(long, env = "RELAY_CONSOLE_PROJECTS_FILE")]
        projects: PathBuf,
    },
    /// After a deploy: submit a `noop` job through the public API; non-zero unless it
    /// succeeds within the bound (needs no database).
    Smoke(smoke::Smoke),
    /// Provider notifications fed locally through the ingress function's handler.
    Ingress {
        #[command(subcommand)]
        command: ingress::IngressCommand,
    },
    /// A tenant's jobs, read from the database.
    Jobs {
        /// The tenant's name.
        #[arg(long)]
        tenant: String,
        #[command(subcommand)]
        command: jobs::JobsCommand,
    },
}

#[derive(Subcommand)]
enum StatusKeyCommand {
    /// Create a status key; prints only the key on stdout.
    Create { name: String },
}

#[derive(Subcommand)]
enum TenantCommand {
    /// Create a tenant; prints only its new API key on stdout.
    Create { name: String },
    #[command(flatten)]
    Keys(ops::TenantKeyCommand),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    // A chaos or bench run's own process logs only errors unless told: its figures are the
    // output (a bench's sweep pass would otherwise log each of its 10,000 returned leases).
    let default_log =
        if matches!(cli.command, Command::Chaos { .. } | Command::Bench { .. }) { "error" } else { "info" };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("RELAY_LOG").unwrap_or_else(|_| default_log.into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let runtime = tokio::runtime::Runtime::new()?;
    runtime.block_on(run(cli))
}

/// Give tasks AWS access when `RELAY_TASK_ROLES`/`RELAY_TENANT_TASK_ROLES` map roles (the SDK's
/// default chain is the process's own identity, which only assumes them); otherwise every
/// task's AWS access is denied.
///
/// Destinations' secrets: with `RELAY_SECRETS_DIR` in the local store there; else, when AWS is
/// configured (`AWS_REGION`, `AWS_DEFAULT_REGION` or `AWS_ENDPOINT_URL`, e.g. a moto server's),
/// in its Secrets Manager; else in the local store in `local_secrets` (`relay dev`'s), if any.
///
/// `local_aws`: a local AWS-protocol server's configuration (`relay dev --local-ses`: the SES
/// stand-in in front of moto) used instead of the environment's for every task's AWS calls,
/// their role sessions and the sweep's SES account read; `email.send` runs as
/// `localaws::EMAIL_SEND_ROLE` unless `RELAY_TASK_ROLES` maps it, and secrets stay local.
async fn with_task_roles(
    p: Platform,
    local_secrets: Option<PathBuf>,
    local_aws: Option<&aws_config::SdkConfig>,
) -> anyhow::Result<Platform> {
    let mut roles = taskdeck::credentials::TaskRoles::from_lookup(|k| std::env::var(k).ok())?;
    if local_aws.is_some() && roles.task_role("email.send").is_none() {
        let role =
            taskdeck::credentials::RoleSpec { role_arn: relay::localaws::EMAIL_SEND_ROLE.into(), external_id: None };
        roles = roles.map_task("email.send", role)?;
    }
    let aws = local_aws.is_none()
        && ["AWS_REGION", "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL"].iter().any(|k| std::env::var_os(k).is_some());
    let local = std::env::var_os("RELAY_SECRETS_DIR").filter(|d| !d.is_empty()).map(PathBuf::from);
    let local = local.or(local_secrets.filter(|_| !aws));
    let p = match &local {
        Some(dir) => {
            p.with_local_secrets(dir).with_context(|| format!("the local secret store in {}", dir.display()))?
        }
        None => p,
    };
    let aws = aws && local.is_none();
    if roles.is_empty() && !aws {
        return Ok(p);
    }
    let sdk = match local_aws {
        Some(sdk) => sdk.clone(),
        None => aws_config::defaults(aws_config::BehaviorVersion::latest()).load().await,
    };
    let p = if aws { p.with_secrets(&sdk) } else { p };
    let p = if aws || local_aws.is_some() { p.with_ses_account(&sdk) } else { p };
    if roles.is_empty() {
        return Ok(p);
    }
    Ok(p.with_credentials(Arc::new(taskdeck::credentials::TaskCredentials::new(roles, &sdk))))
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let url = || relay::devinstance::database_url(cli.database_url.clone(), cli.data_dir.as_deref());
    let ops = || ops_platform(url()?);
    match cli.command {
        Command::Dev { addr, console_addr, local_ses, run } => {
            let data_dir = cli.data_dir.clone().unwrap_or_else(|| relay::devinstance::DEFAULT_DATA_DIR.into());
            dev::run(cli.database_url.clone(), dev::Dev { addr, console_addr, data_dir, local_ses, run }).await
        }
        Command::Ingress { command } => ingress::run(&ops()?, command).await,
        Command::Migrate { retention_days } => {
            let p = Platform::new(&url()?, Settings::default())?;
            let applied = p.migrate().await?;
            eprintln!("migrations applied: {}", if applied.is_empty() { "none".into() } else { applied.join(", ") });
            let s = taskdeck::schedules::ensure_builtin(
                &p.pool,
                u32::try_from(retention_days).unwrap_or(30),
                chrono::Utc::now(),
            )
            .await?;
            eprintln!("built-in schedule {}: {} ({}), next run {}", s.name, s.cron, s.timezone, s.next_run_at);
            Ok(())
        }
        Command::Openapi => {
            print!("{}", taskdeck::api::openapi::document_json());
            Ok(())
        }
        Command::Smoke(s) => smoke::run(s).await,
        Command::Operator { command } => ops::operator(&ops()?, command).await,
        Command::Exceptions { command } => ops::exceptions(&ops()?, &actor(cli.operator), command).await,
        Command::Modes { command } => ops::modes(&ops()?, &actor(cli.operator), command).await,
        Command::Schedules { command } => ops::schedules(&ops()?, &actor(cli.operator), command).await,
        Command::Tenant { command: TenantCommand::Keys(command) } => ops::tenant_key(&ops()?, command).await,
        Command::Serve { addr, run } => {
            let p = with_task_roles(Platform::new(&url()?, run.settings()?)?, None, None).await?;
            let (stop_tx, stop) = watch::channel(false);
            let stop_tx = Arc::new(stop_tx);
            tokio::spawn(shutdown_on_signal(stop_tx));
            serve(&p, bind(addr).await?, stop).await
        }
        Command::Worker { run } => {
            let p = with_task_roles(Platform::new(&url()?, run.settings()?)?, None, None).await?;
            let (stop_tx, stop) = watch::channel(false);
            let stop_tx = Arc::new(stop_tx);
            let workers = p.spawn_workers(run.workers, &stop);
            eprintln!("relay worker: {} loops x {} concurrent jobs", run.workers, run.concurrency);
            shutdown_on_signal(stop_tx).await;
            futures::future::join_all(workers).await;
            Ok(())
        }
        Command::Sweep { keep_going, run } => {
            // With AWS configured, the sweep reads the SES account and writes tenants' topic
            // changes to SES contacts, as the sweeper function does.
            let p = with_task_roles(Platform::new(&url()?, run.settings()?)?, None, None).await?;
            if keep_going {
                let (stop_tx, stop) = watch::channel(false);
                let stop_tx = Arc::new(stop_tx);
                let sweeper = p.spawn_sweeper(&stop);
                shutdown_on_signal(stop_tx).await;
                sweeper.await?;
            } else {
                let report = p.sweeper().pass().await?;
                println!("{}", serde_json::to_string(&report)?);
            }
            Ok(())
        }
        Command::Bench { quick, runs, out, only, peer, pace_rate } => {
            let data_dir = cli.data_dir.clone().unwrap_or_else(|| ".relay/bench-pg".into());
            let (url, cluster) = match cli.database_url.clone() {
                Some(url) => (url, None),
                None => {
                    let cluster = PrivateCluster::start_with(
                        &data_dir,
                        Durability::Full,
                        "-c shared_preload_libraries=pg_stat_statements",
                    )?;
                    ensure_database(&cluster.url("postgres"), "relay_bench").await?;
                    (cluster.url("relay_bench"), Some(cluster))
                }
            };
            let opts = relay::bench::Options {
                quick,
                runs: runs.max(1),
                out,
                only,
                peer,
                peer_dir: "target/peer".into(),
                pace_rate,
            };
            let result = relay::bench::run(&url, &opts).await;
            if let Some(c) = cluster {
                c.stop()?;
            }
            result
        }
        Command::Chaos { scenario, scale, out, tmp } => {
            let data_dir = cli.data_dir.clone().unwrap_or_else(|| ".relay/chaos-pg".into());
            let (url, cluster) = match cli.database_url.clone() {
                Some(url) => (url, None),
                None => {
                    let cluster = PrivateCluster::start(&data_dir, Durability::Throwaway)?;
                    ensure_database(&cluster.url("postgres"), "relay_chaos").await?;
                    (cluster.url("relay_chaos"), Some(cluster))
                }
            };
            std::fs::create_dir_all(&tmp)?;
            let env = relay::chaos::Env::new(url, std::env::current_exe()?, std::fs::canonicalize(&tmp)?, scale);
            let result = chaos(&env, &scenario, &out).await;
            if let Some(c) = cluster {
                c.stop()?;
            }
            let failed = result?;
            if failed > 0 {
                eprintln!("relay chaos: {failed} scenario(s) violated a guarantee");
                std::process::exit(1);
            }
            Ok(())
        }
        Command::StatusKey { command: StatusKeyCommand::Create { name } } => {
            let p = Platform::new(&url()?, Settings::default())?;
            let db = p.pool.get().await?;
            if taskdeck::store::status_keys::by_name(&db, &name).await?.is_some() {
                anyhow::bail!("a status key named {name:?} exists already");
            }
            let (_, key) = taskdeck::store::status_keys::create(&db, &name).await?;
            println!("{key}");
            Ok(())
        }
        Command::Console { addr, projects } => {
            let config = relay_console::ConsoleConfig::from_file(&projects)?;
            let n = config.projects.len();
            let router = relay_console::router(relay_console::Console::new(config)?);
            let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))?;
            eprintln!("relay console: http://{addr}/ watching {n} projects");
            let (stop_tx, mut stop) = watch::channel(false);
            tokio::spawn(shutdown_on_signal(Arc::new(stop_tx)));
            taskdeck::api::server::serve(listener, router, Default::default(), async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await?;
            Ok(())
        }
        Command::Jobs { tenant, command } => {
            let p = Platform::new(&url()?, Settings::default())?;
            jobs::run(&p.pool, &tenant, command).await
        }
        Command::Tenant { command: TenantCommand::Create { name } } => {
            let p = Platform::new(&url()?, Settings::default())?;
            let db = p.pool.get().await?;
            if tenants::by_name(&db, &name).await?.is_some() {
                anyhow::bail!("a tenant named {name:?} exists already");
            }
            let (_, key) = tenants::create(&db, &name).await?;
            println!("{key}");
            Ok(())
        }
    }
}

/// Run one scenario or all; print and write each report. Returns how many had violations
/// (a scenario that could not run counts as one).
async fn chaos(env: &relay::chaos::Env, scenario: &str, out: &std::path::Path) -> anyhow::Result<usize> {
    let names: Vec<&str> = if scenario == "all" { relay::chaos::SCENARIOS.to_vec() } else { vec![scenario] };
    std::fs::create_dir_all(out)?;
    let mut failed = 0;
    let mut reports = Vec::new();
    for name in names {
        match relay::chaos::run(name, env).await {
            Ok(report) => {
                report.print();
                failed += usize::from(!report.violations.is_empty());
                std::fs::write(out.join(format!("{name}.json")), serde_json::to_string_pretty(&report)?)?;
                reports.push(report);
            }
            Err(e) => {
                println!("== {name}: could not run: {e:#}");
                failed += 1;
            }
        }
    }
    if reports.len() > 1 {
        std::fs::write(out.join("all.json"), serde_json::to_string_pretty(&reports)?)?;
    }
    eprintln!("relay chaos: reports in {}", out.display());
    Ok(failed)
}

/// A small platform for one operator command (two connections).
fn ops_platform(url: String) -> anyhow::Result<Platform> {
    let mut s = Settings::default();
    s.pool.max_size = 2;
    s.intake_writers = 1;
    Platform::new(&url, s)
}

/// The "who" of an operator command's audit rows.
fn actor(operator: Option<String>) -> String {
    operator.unwrap_or_else(|| format!("cli:{}", std::env::var("USER").unwrap_or_else(|_| "unknown".into())))
}

/// Wait for Ctrl-C or SIGTERM, then tell everyone to stop.
async fn shutdown_on_signal(stop: Arc<watch::Sender<bool>>) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {},
    }
    eprintln!("relay: stopping (finishing jobs in flight)...");
    let _ = stop.send(true);
}

async fn bind(addr: SocketAddr) -> anyhow::Result<tokio::net::TcpListener> {
    tokio::net::TcpListener::bind(addr).await.with_context(|| format!("binding {addr}"))
}

async fn serve(p: &Platform, listener: tokio::net::TcpListener, mut stop: watch::Receiver<bool>) -> anyhow::Result<()> {
    p.liveness(taskdeck::liveness::Kind::Api).spawn(stop.clone());
    let router = taskdeck::api::router(p.app_state());
    taskdeck::api::server::serve(listener, router, Default::default(), async move {
        let _ = stop.wait_for(|s| *s).await;
    })
    .await?;
    Ok(())
}

/// Create a database if it does not exist (private clusters start with only `postgres`).
async fn ensure_database(admin_url: &str, name: &str) -> anyhow::Result<()> {
    let admin = relay::bench::setup::admin(admin_url).await?;
    Ok(taskdeck::store::tooling::ensure_database(&admin, name).await?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tool refuses a shared setting's out-of-bounds value with the Lambda reader's words.
    #[test]
    fn flags_refuse_what_the_lambda_settings_refuse() {
        let refused = |args: &[&str]| Cli::try_parse_from(args).err().map(|e| e.to_string()).unwrap_or_default();
        let lambda = taskdeck::config::LEASE_SECONDS.parse("2").unwrap_err().to_string();
        let e = refused(&["relay", "worker", "--lease-seconds", "2"]);
        assert!(e.contains(&lambda), "{e}");
        let e = refused(&["relay", "worker", "--limit-templates", "1000000001"]);
        assert!(
            e.contains("RELAY_LIMIT_TEMPLATES is invalid (\"1000000001\"): must be between 0 and 1000000000"),
            "{e}"
        );
        let e = refused(&["relay", "migrate", "--retention-days", "0"]);
        assert!(e.contains("RELAY_RETENTION_DAYS is invalid"), "{e}");
        let ok = Cli::try_parse_from(["relay", "worker", "--lease-seconds", "3"]);
        assert!(ok.is_ok(), "3 s is the shortest lease both take");
    }
}
