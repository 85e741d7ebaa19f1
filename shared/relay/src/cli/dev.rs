//! `relay dev`: the whole platform in one process: API, workers, sweep, and the console
//! watching this instance. A private Postgres cluster unless `DATABASE_URL` is set; its
//! address stays the same across starts and is recorded in the data dir (`relay-dev.json`)
//! for the other `relay` commands. With `--local-ses RATE` its email goes to a local SES: the
//! throttling stand-in (`ses_standin`) in front of moto, allowing RATE sends a second.

use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use relay::devinstance::{self, DevInstance};
use relay::pgcluster::{Durability, PrivateCluster};
use relay::ses_standin::{self, Faults};
use taskdeck::email::{pace, ses};
use taskdeck::platform::Platform;
use taskdeck::store::modes::{self, Modes};
use taskdeck::store::send_rates::{self, Scope};
use taskdeck::store::{status_keys, tenants};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::{Run, bind, ensure_database, serve, with_task_roles};

/// The status key the dev console reads `/v1/status` with.
const CONSOLE_KEY_NAME: &str = "relay-dev-console";
/// The domain the `dev` tenant may send from (verified in moto with `--local-ses`).
const DEV_DOMAIN: &str = "example.com";
/// The local SES's 24-hour quota (`GetAccount`'s `Max24HourSend`).
const LOCAL_SES_QUOTA: f64 = 50_000.0;

pub struct Dev {
    pub addr: SocketAddr,
    pub console_addr: SocketAddr,
    pub data_dir: PathBuf,
    /// `--local-ses`: the local SES's rate, sends a second.
    pub local_ses: Option<u32>,
    pub run: Run,
}

pub async fn run(url: Option<String>, dev: Dev) -> anyhow::Result<()> {
    let Dev { addr, console_addr, data_dir, local_ses: rate, run } = dev;
    let previous = DevInstance::read(&data_dir);
    let (url, cluster) = match url {
        Some(url) => (url, None),
        None => {
            let wanted = previous.as_ref().and_then(DevInstance::database_port);
            let cluster = PrivateCluster::start_on(&data_dir, Durability::Full, wanted)?;
            ensure_database(&cluster.url("postgres"), "relay").await?;
            eprintln!("relay dev: private Postgres in {} on port {}", cluster.data_dir.display(), cluster.port);
            if let Some(w) = wanted.filter(|w| *w != cluster.port) {
                eprintln!(
                    "relay dev: port {w}, the database's port at the last start, is taken by another program; \
                           using {} from now on",
                    cluster.port
                );
            }
            (cluster.url("relay"), Some(cluster))
        }
    };
    let local_aws = match rate {
        Some(rate) => Some(local_ses(&data_dir, rate).await?),
        None => None,
    };
    let p = with_task_roles(Platform::new(&url, run.settings()?)?, Some(secrets_dir(&data_dir)), local_aws.as_ref())
        .await?;
    p.migrate().await?;
    taskdeck::schedules::ensure_builtin(&p.pool, 30, chrono::Utc::now()).await?;
    let key = dev_tenant_key(&p).await?;
    if let (Some(rate), Some(sdk)) = (rate, &local_aws) {
        read_local_account(&p, sdk, rate).await?;
    } else if let Some(local) = previous.as_ref().and_then(|d| d.local_ses) {
        forget_local_account(&p, local).await?;
    }
    let status_key = console_key(&p, previous.and_then(|d| d.status_key)).await?;
    let api = bind(addr).await?;
    let here = if addr.ip().is_unspecified() { SocketAddr::from((Ipv4Addr::LOCALHOST, addr.port())) } else { addr };
    let api_url = format!("http://{here}");
    let console = match TcpListener::bind(console_addr).await {
        Ok(l) => Some(l),
        Err(e) => {
            eprintln!(
                "relay dev: no console: cannot listen on {console_addr} ({e}); choose another with --console-addr"
            );
            None
        }
    };
    let console_url = console.as_ref().map(|_| format!("http://{console_addr}/"));
    if let Some(c) = &cluster {
        let instance = DevInstance {
            database_url: url.clone(),
            api_url: api_url.clone(),
            console_url: console_url.clone(),
            status_key: Some(status_key.clone()),
            local_ses: rate,
        };
        instance.write(&c.data_dir)?;
    }
    let outbound = outbound(&modes::load_global(&p.pool.get().await?).await?, rate);
    banner(&run, &api_url, console_url.as_deref(), &key, cluster.as_ref().map(|_| url.as_str()), &data_dir, &outbound);
    println!("{key}");

    let (stop_tx, stop) = watch::channel(false);
    let workers = p.spawn_workers(run.workers, &stop);
    let sweeper = p.spawn_sweeper(&stop);
    let console = console.map(|listener| {
        let project = relay_console::Project {
            name: "relay dev".into(),
            status_url: format!("{api_url}/v1/status"),
            token: Some(status_key),
        };
        let config = relay_console::ConsoleConfig {
            projects: vec![project],
            timeout: relay_console::ConsoleConfig::DEFAULT_TIMEOUT,
            refresh: Duration::from_secs(5),
        };
        let mut stop = stop.clone();
        tokio::spawn(async move {
            let router = relay_console::router(relay_console::Console::new(config)?);
            taskdeck::api::server::serve(listener, router, Default::default(), async move {
                let _ = stop.wait_for(|s| *s).await;
            })
            .await?;
            anyhow::Ok(())
        })
    });
    let grace = Duration::from_secs(run.lease_seconds);
    let signals = tokio::spawn(stop_on_signals(stop_tx, grace, cluster.clone()));
    let served = serve(&p, api, stop).await;
    futures::future::join_all(workers).await;
    let _ = sweeper.await;
    if let Some(c) = console {
        let _ = c.await;
    }
    signals.abort();
    if let Some(c) = cluster {
        p.pool.close();
        p.api_pool.close();
        c.stop()?;
        eprintln!("relay dev: private Postgres stopped; data kept in {}", c.data_dir.display());
    }
    served
}

/// The `dev` tenant's key, new on every start; the tenant may send from `DEV_DOMAIN`.
async fn dev_tenant_key(p: &Platform) -> anyhow::Result<String> {
    let db = p.pool.get().await?;
    let (tenant, key) = match tenants::by_name(&db, "dev").await? {
        Some(t) => (t.id, tenants::rotate_key(&db, t.id).await?),
        None => tenants::create(&db, "dev").await.map(|(t, k)| (t.id, k))?,
    };
    // Email works out of the box: any address at example.com, in shadow mode (nothing leaves).
    taskdeck::store::sending_identities::add(&db, tenant, DEV_DOMAIN).await?;
    Ok(key)
}

/// `--local-ses`: moto (`RELAY_MOTO_URL`, else from a venv beside the data dir, installed on
/// first use) with `DEV_DOMAIN` verified in it, and the SES stand-in in front of it allowing
/// `rate` sends a second (throttling beyond) and answering `GetAccount` with `rate` and
/// `LOCAL_SES_QUOTA`. Returns the SDK configuration this instance's AWS calls use: the
/// stand-in's (it passes STS and the rest through to moto). Both stop when this process exits.
async fn local_ses(data_dir: &Path, rate: u32) -> anyhow::Result<aws_config::SdkConfig> {
    let dir = aws_dir(data_dir);
    match std::env::var("RELAY_MOTO_URL").ok().filter(|u| !u.is_empty()) {
        Some(url) => eprintln!("relay dev: starting the local SES in front of moto at {url} (RELAY_MOTO_URL)"),
        None => eprintln!(
            "relay dev: starting the local SES (moto, from a venv in {}; installing it the first time may take a minute)",
            dir.display()
        ),
    }
    let moto = tokio::task::spawn_blocking(move || relay::localaws::moto_for_this_process(&dir))
        .await?
        .context("starting moto for --local-ses (needs python3, and PyPI the first time; or set RELAY_MOTO_URL)")?;
    let verified = ses::client(&relay::localaws::sdk_config(&moto))
        .create_email_identity()
        .email_identity(DEV_DOMAIN)
        .send()
        .await;
    if let Err(e) = verified
        && !e.as_service_error().is_some_and(|e| e.is_already_exists_exception())
    {
        return Err(anyhow::Error::new(e).context(format!("verifying {DEV_DOMAIN} in moto ({moto})")));
    }
    let faults = Faults {
        max_per_second: Some(rate as usize),
        account: Some((rate.into(), LOCAL_SES_QUOTA)),
        ..Faults::default()
    };
    let standin = ses_standin::start(&moto, faults, 0).context("starting the SES stand-in")?;
    Ok(relay::localaws::sdk_config(&standin.url))
}

/// The account's rate and quota read from the local SES now (not a minute later at the sweep's
/// next read: the last start may have had another rate), so the first sends are paced at it.
async fn read_local_account(p: &Platform, sdk: &aws_config::SdkConfig, rate: u32) -> anyhow::Result<()> {
    pace::read_account(&p.pool, sdk).await?;
    let account = send_rates::get(&p.pool.get().await?, Scope::Account, "default").await?;
    let Some(account) = account else { anyhow::bail!("the local SES's account rate was not recorded") };
    if let Some(why) = account.read_error.filter(|_| account.provider_rate != Some(rate.into())) {
        anyhow::bail!("reading the local SES's account rate: {why}");
    }
    if let Some(set) = account.rate_per_second {
        eprintln!(
            "relay dev: an operator's account rate of {set}/s holds instead of the local SES's {rate}/s \
             (PUT /v1/admin/send-rates/account/default with \"rate_per_second\": null to clear it)"
        );
    }
    Ok(())
}

/// A start without `--local-ses` after one with it: the account's rate and quota read from the
/// local SES would otherwise pace sends to real SES until the sweep next reads AWS (never,
/// without AWS access), so they are forgotten.
async fn forget_local_account(p: &Platform, local: u32) -> anyhow::Result<()> {
    if send_rates::forget_account_reading(&p.pool.get().await?, "default").await? {
        eprintln!(
            "relay dev: the account rate read from the local SES (--local-ses {local}) at the last start is \
             forgotten; the sweep reads the account from AWS"
        );
    }
    Ok(())
}

/// The console's status key: the one kept from the last start while it still works, else
/// the named key with a new value (or a new named key).
async fn console_key(p: &Platform, kept: Option<String>) -> anyhow::Result<String> {
    let db = p.pool.get().await?;
    if let Some(key) = kept
        && status_keys::by_key(&db, &key).await?.is_some_and(|k| k.name == CONSOLE_KEY_NAME)
    {
        return Ok(key);
    }
    match status_keys::rotate(&db, CONSOLE_KEY_NAME).await? {
        Some(key) => Ok(key),
        None => Ok(status_keys::create(&db, CONSOLE_KEY_NAME).await?.1),
    }
}

fn banner(
    run: &Run,
    api: &str,
    console: Option<&str>,
    key: &str,
    database_url: Option<&str>,
    data_dir: &Path,
    outbound: &str,
) {
    let try_key = format!("try-{}", &uuid::Uuid::now_v7().simple().to_string()[20..]);
    let console = match console {
        Some(url) => format!("console on {url} (watching this instance)"),
        None => "no console (see above)".into(),
    };
    let database = match database_url {
        Some(url) => format!(
            "  export DATABASE_URL={url}\n      \
             (optional: relay commands run here find it in {} by themselves)\n",
            devinstance::path(data_dir).display()
        ),
        None => String::new(),
    };
    eprintln!(
        "relay dev: API on {api}, {workers} worker loops, sweep every {sweep}s; {console}\n\n\
         dev tenant API key (new on every start):\n\n  export RELAY_API_KEY={key}\n{database}\n\
         try:\n  curl -s -X POST {api}/v1/jobs -H \"Authorization: Bearer $RELAY_API_KEY\" \\\n    \
         -H 'Idempotency-Key: {try_key}' -H 'Content-Type: application/json' \\\n    \
         -d '{{\"task_type\": \"noop\", \"params\": {{\"echo\": \"hi\"}}}}'\n  \
         relay jobs --tenant dev watch <id>\n\n\
         {outbound}\
         Ctrl-C stops (jobs in flight get up to {grace} s); Ctrl-C twice stops at once.\n",
        workers = run.workers,
        sweep = run.sweep_interval_seconds,
        grace = run.lease_seconds,
    );
}

/// What happens to email and callbacks under the operating modes this instance starts with
/// (kept in its database from earlier runs), and where email goes with `--local-ses`.
fn outbound(modes: &Modes, local_ses: Option<u32>) -> String {
    let modes = modes_line(modes);
    let email = match local_ses {
        Some(rate) => format!(
            "\nlocal SES on (--local-ses {rate}): with shadow off and write:ses on (relay modes set shadow off,\n\
             relay modes set write:ses on), email goes to a stand-in for SES on this machine (moto behind it;\n\
             nothing leaves) that allows {rate} sends a second ({quota} a day) and throttles beyond; Relay\n\
             paces sends at that rate. Throttles and the rate: the console, or GET /v1/status (send_rates).\n\n",
            quota = LOCAL_SES_QUOTA,
        ),
        None => String::new(),
    };
    format!("{modes}{email}")
}

/// The banner's line on shadow mode and the integrations' switches.
fn modes_line(modes: &Modes) -> String {
    if modes.shadow() {
        return "shadow mode is on: email and callbacks are recorded, not sent (GET /v1/messages?job_id=<id>,\n\
                GET /v1/jobs/<id>/callbacks). email.send may send from any address at example.com. To let them\n\
                out: relay modes set shadow off, then relay modes set write:ses on / write:callbacks on\n\
                (or PUT /v1/admin/modes with an operator key).\n"
            .into();
    }
    let state = |integration: &str| match modes.writes_enabled(integration) {
        true => format!("sent (write:{integration} on)"),
        false => format!("recorded, not sent (write:{integration} off)"),
    };
    format!(
        "shadow mode is OFF (turned off in an earlier run): email is {ses}, callbacks are {callbacks}.\n\
         relay modes set shadow on records them all again.\n",
        ses = state("ses"),
        callbacks = state("callbacks"),
    )
}

/// The first Ctrl-C (or SIGTERM) stops gracefully, counting down the time jobs in flight
/// have left; a second one exits at once (their leases expire and the sweep returns them, as
/// after a crash), stopping the private cluster first.
async fn stop_on_signals(stop: watch::Sender<bool>, grace: Duration, cluster: Option<PrivateCluster>) {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
    let mut signal = async || {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = async { match term.as_mut() { Some(t) => { t.recv().await; } None => std::future::pending().await } } => {},
        }
    };
    signal().await;
    eprintln!(
        "relay dev: stopping: no new claims; jobs in flight have up to {} s to finish (Ctrl-C again: stop now)",
        grace.as_secs()
    );
    let _ = stop.send(true);
    let started = Instant::now();
    let tty = std::io::stderr().is_terminal();
    let mut ticks = tokio::time::interval(Duration::from_secs(1));
    ticks.tick().await;
    loop {
        tokio::select! {
            _ = signal() => break,
            _ = ticks.tick() => {
                let left = grace.saturating_sub(started.elapsed()).as_secs();
                if tty {
                    eprint!("\rrelay dev: {left:>3} s left for jobs in flight (Ctrl-C: stop now)\x1b[K");
                } else if left.is_multiple_of(5) || left + 2 >= grace.as_secs() {
                    eprintln!("relay dev: {left} s left for jobs in flight (Ctrl-C: stop now)");
                }
            }
        }
    }
    eprintln!(
        "{}relay dev: stopping now; jobs in flight return to the queue when their leases expire",
        if tty { "\n" } else { "" }
    );
    if let Some(c) = cluster
        && let Err(e) = c.stop()
    {
        eprintln!("relay dev: could not stop the private Postgres: {e:#}");
    }
    std::process::exit(130);
}

/// Where `relay dev --local-ses` keeps moto's venv and log: beside the database's folder
/// (`.relay/pg` → `.relay/pg-aws`).
fn aws_dir(data_dir: &Path) -> PathBuf {
    sibling(data_dir, "aws")
}

/// Where `relay dev` keeps destinations' secrets unless `RELAY_SECRETS_DIR` says: beside the
/// database's folder (`.relay/pg` → `.relay/pg-secrets`), encrypted under a key kept there.
pub fn secrets_dir(data_dir: &std::path::Path) -> std::path::PathBuf {
    sibling(data_dir, "secrets")
}

/// `data_dir`'s sibling named after it with `-suffix`.
fn sibling(data_dir: &Path, suffix: &str) -> PathBuf {
    let name = data_dir.file_name().map_or_else(|| "relay".into(), |n| n.to_string_lossy().into_owned());
    data_dir.with_file_name(format!("{name}-{suffix}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn modes(switches: &[(&str, bool)]) -> Modes {
        Modes::from_json(&serde_json::Value::Object(
            switches.iter().map(|(k, v)| (k.to_string(), serde_json::Value::Bool(*v))).collect(),
        ))
    }

    #[test]
    fn the_banner_says_what_the_modes_it_starts_with_do_to_email_and_callbacks() {
        assert!(modes_line(&modes(&[])).starts_with("shadow mode is on: email and callbacks are recorded, not sent"));
        assert!(modes_line(&modes(&[("write:ses", true)])).starts_with("shadow mode is on"));
        let off = modes_line(&modes(&[("shadow", false), ("write:ses", true)]));
        assert!(off.starts_with("shadow mode is OFF"), "{off}");
        assert!(off.contains("email is sent (write:ses on)"), "{off}");
        assert!(off.contains("callbacks are recorded, not sent (write:callbacks off)"), "{off}");
    }
}
