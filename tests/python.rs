//! The Python package (`shared/python`, `relay_client`): ruff and mypy on it, then its pytest
//! suite on each supported Django (6.x, and 5.2 LTS through the `django-tasks` backport), run
//! against the relay binary cargo built (`relay dev` and `relay console`, started by pytest's
//! fixtures), the test Postgres and a Django live server. Each venv is made once under the target
//! dir from its pinned requirements file (Python 3.12 or newer: found on PATH or in pyenv, or
//! named by `RELAY_PYTHON`).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const PACKAGE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../python");

/// A Python 3.12+ interpreter: `RELAY_PYTHON`, `python3.13`/`python3.12` on PATH, or pyenv's newest
/// (`PYENV_ROOT`, default `~/.pyenv`: found without pyenv on PATH).
pub(crate) fn python() -> PathBuf {
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
    candidates
        .into_iter()
        .find(|p| works(p))
        .expect("no Python 3.12+ found (Django 6 needs it): install one or set RELAY_PYTHON")
}

/// The venv for one requirements file. A new pin, dependency or interpreter makes a new venv (the
/// `.ready` marker would keep an old one). `editable` also installs the package itself (`pip -e`
/// builds in the source tree, so only one flavour does; the other imports it from the tree).
fn venv(requirements: &str, editable: bool) -> PathBuf {
    let python = python();
    let requirements = Path::new(PACKAGE).join(requirements);
    let pins = std::fs::read_to_string(&requirements).expect("the requirements file");
    let project = std::fs::read_to_string(Path::new(PACKAGE).join("pyproject.toml")).expect("pyproject.toml");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (pins.as_str(), project.as_str(), python.to_string_lossy(), editable).hash(&mut h);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("python-venv-{:016x}", h.finish()));
    let req = requirements.to_string_lossy().into_owned();
    let mut args = vec!["-r", req.as_str()];
    if editable {
        args.extend(["-e", PACKAGE]);
    }
    relay::localaws::venv_with(&python, &dir, &args).expect("the venv")
}

fn report(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// ruff (lint and format) and mypy (strict, django-stubs) as the package's `pyproject.toml` sets them.
fn lint(venv: &Path) {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("python-mypy-cache");
    let tools: [(&str, Vec<&str>); 3] = [
        ("ruff", vec!["check", "--no-cache", "."]),
        ("ruff", vec!["format", "--check", "--no-cache", "."]),
        ("mypy", vec!["--cache-dir", cache.to_str().expect("a UTF-8 target dir")]),
    ];
    for (tool, args) in tools {
        let out = Command::new(venv.join("bin").join(tool))
            .args(&args)
            .current_dir(PACKAGE)
            .output()
            .unwrap_or_else(|e| panic!("{tool} runs: {e}"));
        assert!(out.status.success(), "{tool} {} found problems:\n{}", args.join(" "), report(&out));
    }
}

/// The pytest suite in `venv`, which must find Django `django` (`major.minor`).
fn pytest(venv: &Path, django: &str) {
    let flavour = django.replace('.', "_");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let basetemp = tmp.join(format!("pytest-{}-{flavour}", std::process::id()));
    let out = Command::new(venv.join("bin/pytest"))
        .args(["-q", "-p", "no:cacheprovider", "--basetemp"])
        .arg(&basetemp)
        .current_dir(PACKAGE)
        .env("RELAY_BIN", env!("CARGO_BIN_EXE_relay"))
        .env("DATABASE_URL", crate::support::database_url())
        // Its own Django test database, so two runs at once do not share one.
        .env("DJANGO_TEST_DB_NAME", format!("test_relay_py_{}_{flavour}", std::process::id()))
        .env("RELAY_EXPECT_DJANGO", django)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .env_remove("DJANGO_SETTINGS_MODULE")
        .output()
        .expect("pytest runs");
    let _ = std::fs::remove_dir_all(&basetemp);
    let report = report(&out);
    assert!(out.status.success(), "pytest on Django {django} failed:\n{report}");
    assert!(report.contains(" passed"), "pytest ran no test:\n{report}");
    eprintln!("Django {django}: {}", report.lines().rev().find(|l| l.contains(" passed")).unwrap_or_default());
}

#[test]
fn the_python_package_is_lint_clean_and_passes_its_pytest_suite_on_django_6() {
    let venv = venv("requirements-test.txt", true);
    lint(&venv);
    pytest(&venv, "6.1");
}

#[test]
fn the_python_package_passes_its_pytest_suite_on_django_5_2_lts() {
    pytest(&venv("requirements-test-django52.txt", false), "5.2");
}
