//! The Python package (`shared/python`, `relay_client`): its pytest suite, run against the
//! relay binary cargo built (`relay dev` and `relay console`, started by pytest's fixtures), the
//! test Postgres and a Django live server. The venv is made once under the target dir from the
//! pinned `requirements-test.txt` (Django 6 needs Python 3.12 or newer: found on PATH or in
//! pyenv, or named by `RELAY_PYTHON`).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../python");

/// A Python 3.12+ interpreter: `RELAY_PYTHON`, `python3.13`/`python3.12` on PATH, or pyenv's newest
/// (`PYENV_ROOT`, default `~/.pyenv`: found without pyenv on PATH).
fn python() -> Option<PathBuf> {
    let works = |p: &Path| {
        Command::new(p)
            .args(["-c", "import sys, venv; sys.exit(sys.version_info < (3, 12))"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let mut candidates: Vec<PathBuf> = std::env::var_os("RELAY_PYTHON").map(PathBuf::from).into_iter().collect();
    candidates.extend(["python3.13", "python3.12", "python3"].map(PathBuf::from));
    let pyenv_root = std::env::var_os("PYENV_ROOT")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".pyenv")));
    if let Some(root) = pyenv_root {
        let mut versions: Vec<PathBuf> = std::fs::read_dir(root.join("versions"))
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path().join("bin/python3"))).collect())
            .unwrap_or_default();
        versions.sort();
        candidates.extend(versions.into_iter().rev());
    }
    candidates.into_iter().find(|p| works(p))
}

#[test]
fn the_python_package_passes_its_pytest_suite() {
    let Some(python) = python() else {
        panic!("no Python 3.12+ found (Django 6 needs it): install one or set RELAY_PYTHON");
    };
    let requirements = Path::new(PACKAGE).join("requirements-test.txt");
    let pins = std::fs::read_to_string(&requirements).expect("requirements-test.txt");
    // A new pin or interpreter makes a new venv (the `.ready` marker would keep an old one).
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (pins.as_str(), python.to_string_lossy()).hash(&mut h);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("python-venv-{:016x}", h.finish()));
    let req = requirements.to_string_lossy().into_owned();
    let venv = relay::localaws::venv_with(&python, &dir, &["-r", &req, "-e", PACKAGE]).expect("the venv");

    let basetemp = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("pytest-{}", std::process::id()));
    let out = Command::new(venv.join("bin/pytest"))
        .args(["-q", "-p", "no:cacheprovider", "--basetemp"])
        .arg(&basetemp)
        .current_dir(PACKAGE)
        .env("RELAY_BIN", env!("CARGO_BIN_EXE_relay"))
        .env("DATABASE_URL", crate::support::database_url())
        // Its own Django test database, so two runs at once do not share one.
        .env("DJANGO_TEST_DB_NAME", format!("test_relay_py_{}", std::process::id()))
        .env_remove("DJANGO_SETTINGS_MODULE")
        .output()
        .expect("pytest runs");
    let _ = std::fs::remove_dir_all(&basetemp);
    let report = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "pytest failed:\n{report}");
    assert!(report.contains(" passed"), "pytest ran no test:\n{report}");
    eprintln!("{}", report.lines().rev().find(|l| l.contains(" passed")).unwrap_or_default());
}
