//! Scenario 11, auth: 100,000 random and near-miss keys (one character changed, cut short, one
//! extra, the wrong prefix, another tenant's key with a case flipped) against `relay serve`,
//! interleaved: every one 401, and no timing difference worth measuring between random and
//! near-miss keys (keys are compared as sha256 hashes by an index lookup, never by prefix).
//! The server logs at debug level meanwhile; no key (nor the real one) may appear in any line.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use rand::Rng;
use rand::seq::SliceRandom;

use super::harness;
use super::{Env, Report};
use taskdeck::platform::Settings;
use taskdeck::store::tenants;

/// A difference of medians below this many microseconds, or below this share, is not worth
/// measuring on a shared machine (one scheduler tick is larger).
const NOISE_US: f64 = 100.0;
const NOISE_SHARE: f64 = 0.2;

fn near_miss(key: &str, rng: &mut impl Rng) -> String {
    let mut chars: Vec<char> = key.chars().collect();
    match rng.random_range(0..5) {
        0 => {
            let i = rng.random_range(3..chars.len());
            chars[i] = if chars[i] == 'A' { 'B' } else { 'A' };
            chars.into_iter().collect()
        }
        1 => chars[..chars.len() - 1].iter().collect(),
        2 => format!("{key}x"),
        3 => format!("ro_{}", &key[3..]),
        _ => {
            let i = chars.iter().position(|c| c.is_ascii_alphabetic() && *c != 'r' && *c != 'k').unwrap_or(3);
            chars[i] = if chars[i].is_ascii_uppercase() {
                chars[i].to_ascii_lowercase()
            } else {
                chars[i].to_ascii_uppercase()
            };
            chars.into_iter().collect()
        }
    }
}

pub async fn run(env: &Env) -> anyhow::Result<Report> {
    let mut report = Report::new("auth", env.scale);
    let n = env.n(100_000, 2000);
    let scratch = env.scratch(Settings::default()).await?;
    let (_, other_key) = tenants::create(&scratch.platform.pool.get().await?, "other").await?;
    let real = scratch.key.clone();
    let (server, http) =
        harness::serve(&env.relay, &scratch.url, &[("RELAY_LOG", "debug".into())], &env.log("auth-serve")).await?;
    let (ok, _) = http.call("GET", "/v1/tasks", Some(&real), None, None).await?;
    report.check(ok == 200, format!("the real key answered {ok}"));

    let mut keys: Vec<(bool, String)> = {
        let mut rng = rand::rng();
        (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    (false, tenants::new_key("rk"))
                } else {
                    let base = if i % 4 == 1 { &real } else { &other_key };
                    (true, near_miss(base, &mut rng))
                }
            })
            .collect()
    };
    keys.shuffle(&mut rand::rng());
    keys.retain(|(_, k)| k != &real && k != &other_key);
    let keys = Arc::new(keys);
    let start = Instant::now();
    let clients = 8;
    let tasks: Vec<_> = (0..clients)
        .map(|c| {
            let (http, keys) = (http.clone(), keys.clone());
            tokio::spawn(async move {
                let mut out = Vec::new();
                for (near, key) in keys.iter().skip(c).step_by(clients) {
                    let t = Instant::now();
                    let (status, body) = http.call("GET", "/v1/tasks", Some(key), None, None).await?;
                    out.push((*near, status, t.elapsed().as_secs_f64() * 1e6, body["error"]["code"] == "unauthorized"));
                }
                anyhow::Ok(out)
            })
        })
        .collect();
    let mut results = Vec::new();
    for t in tasks {
        results.extend(t.await??);
    }
    let elapsed = start.elapsed().as_secs_f64();
    let mut by_status: BTreeMap<u16, usize> = BTreeMap::new();
    for (_, s, _, _) in &results {
        *by_status.entry(*s).or_default() += 1;
    }
    let not_401 = results.iter().filter(|(_, s, _, coded)| *s != 401 || !coded).count();
    let lat = |near: bool| harness::sorted(results.iter().filter(|r| r.0 == near).map(|r| r.2).collect());
    let (random, nearly) = (lat(false), lat(true));
    let (m_random, m_near) = (harness::percentile(&random, 0.5), harness::percentile(&nearly, 0.5));
    let diff = m_near - m_random;
    // Let the last log lines land, then read them.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let log = server.log_text();
    let secret_bodies: Vec<&str> = [real.as_str(), other_key.as_str()].into_iter().map(|k| &k[3..]).collect();
    let leaked_real = secret_bodies.iter().filter(|b| log.contains(*b)).count();
    let leaked_tried = tried_keys_in(&log, &keys);
    report.fig("keys tried (random / near-miss)", format!("{} / {}", random.len(), nearly.len()));
    report.fig("requests/s", results.len() as f64 / elapsed);
    report.fig("answers by status", &by_status);
    report.fig("median µs random / near-miss", format!("{m_random:.0} / {m_near:.0}"));
    report.fig(
        "p99 µs random / near-miss",
        format!("{:.0} / {:.0}", harness::percentile(&random, 0.99), harness::percentile(&nearly, 0.99)),
    );
    report.fig("median difference µs (near − random)", diff);
    report.fig("server log lines (debug)", log.lines().count());
    report.fig("log lines with a real key / a tried key", format!("{leaked_real} / {leaked_tried}"));
    report.check(not_401 == 0, format!("{not_401} keys were not answered 401 unauthorized"));
    report.check(
        diff.abs() < NOISE_US || diff.abs() < NOISE_SHARE * m_random,
        format!("near-miss keys differ by {diff:.0} µs in median"),
    );
    report.check(leaked_real == 0 && leaked_tried == 0, "a key appeared in the server's log");
    drop(server);
    scratch.drop_schema(&env.url).await?;
    Ok(report)
}

/// Log lines holding 16 consecutive characters of any tried key's body: one pass over the
/// log's base64url runs against a set of the keys' 16-character windows' first window.
fn tried_keys_in(log: &str, keys: &[(bool, String)]) -> usize {
    const W: usize = 16;
    let prefixes: std::collections::HashSet<&str> =
        keys.iter().filter(|(_, k)| k.len() >= 3 + W).map(|(_, k)| &k[3..3 + W]).collect();
    log.lines()
        .filter(|line| {
            line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_')).filter(|t| t.len() >= W).any(
                |t| {
                    (0..=t.len() - W)
                        .any(|i| t.is_char_boundary(i) && t.is_char_boundary(i + W) && prefixes.contains(&t[i..i + W]))
                },
            )
        })
        .count()
}
