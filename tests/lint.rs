//! cfn-lint on every template with SAM expanded first: the pinned cfn-lint
//! (`infra/lint-requirements.txt`, a venv made once under the target dir) runs the SAM
//! transform, so the checks see the resources SAM generates (each function's `Version`, its
//! alias `live`, the CodeDeploy deployment group whose alarms gate the alias) and a dependency
//! cycle through them (E3004) fails here, not in CloudFormation. Any finding fails: errors,
//! warnings and the informational checks alike.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

const INFRA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../infra");

/// The templates the runbook deploys, each linted.
pub(crate) const TEMPLATES: [&str; 3] = ["template.yaml", "console.yaml", "foundation.yaml"];

/// The venv holding the pinned cfn-lint (a new pin makes a new venv), made once per test run.
fn venv() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(make_venv).clone()
}

fn make_venv() -> PathBuf {
    let requirements = Path::new(INFRA).join("lint-requirements.txt");
    let pins = std::fs::read_to_string(&requirements).expect("infra/lint-requirements.txt");
    let python = crate::python::python();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (pins.as_str(), python.to_string_lossy()).hash(&mut h);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("cfn-lint-venv-{:016x}", h.finish()));
    let req = requirements.to_string_lossy().into_owned();
    relay::localaws::venv_with(&python, &dir, &["-r", req.as_str()]).expect("the cfn-lint venv")
}

/// cfn-lint's findings on these files (`--format json`), and whether it exited 0.
pub(crate) fn cfn_lint(files: &[PathBuf]) -> (Vec<Value>, bool) {
    let out = Command::new(venv().join("bin/cfn-lint"))
        .args(["--include-checks", "I", "--format", "json", "--"])
        .args(files)
        .output()
        .expect("cfn-lint runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let findings: Vec<Value> = serde_json::from_str(&text).unwrap_or_else(|e| {
        panic!("cfn-lint printed what is not JSON ({e}): {text}\n{}", String::from_utf8_lossy(&out.stderr))
    });
    (findings, out.status.success())
}

fn summary(findings: &[Value]) -> String {
    findings
        .iter()
        .map(|f| {
            format!(
                "{} {} {}:{} {}",
                f["Level"].as_str().unwrap_or("?"),
                f["Rule"]["Id"].as_str().unwrap_or("?"),
                f["Filename"].as_str().unwrap_or("?"),
                f["Location"]["Start"]["LineNumber"],
                f["Message"].as_str().unwrap_or("?"),
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The optional foundation stack gives the platform stack what it asks for: each output is a
/// platform parameter of the same name, every parameter without a default that the
/// foundation can know is among them, and the database is reached through a proxy that
/// requires TLS and authenticates with a secret RDS manages.
#[test]
fn the_foundation_stacks_outputs_are_the_platform_stacks_parameters() {
    let f = crate::template::load("foundation.yaml");
    let t = crate::template::template();
    let outputs: Vec<&String> = f["Outputs"].as_object().unwrap().keys().collect();
    for o in &outputs {
        assert!(t["Parameters"].get(o.as_str()).is_some(), "{o} is a parameter of the platform stack");
    }
    for p in ["DatabaseProxyEndpoint", "DatabaseSecretArn", "SubnetIds", "SecurityGroupIds", "VpcId", "VpcCidr"] {
        assert!(outputs.iter().any(|o| o.as_str() == p), "the foundation gives {p}");
    }
    let r = &f["Resources"];
    assert_eq!(r["Database"]["Properties"]["ManageMasterUserPassword"], true, "the login is RDS's managed secret");
    assert_eq!(r["Database"]["Properties"]["PubliclyAccessible"], false);
    assert_eq!(r["Proxy"]["Properties"]["RequireTLS"], true, "verify-full through the proxy");
    assert_eq!(
        r["Proxy"]["Properties"]["Auth"][0]["SecretArn"], f["Outputs"]["DatabaseSecretArn"]["Value"],
        "the proxy and the functions use one secret"
    );
}

#[test]
fn every_template_passes_cfn_lint_with_sam_expanded() {
    let files: Vec<PathBuf> = TEMPLATES.iter().map(|t| Path::new(INFRA).join(t)).collect();
    let (findings, ok) = cfn_lint(&files);
    assert!(findings.is_empty() && ok, "cfn-lint found:\n{}", summary(&findings));
}

/// The lint sees through SAM: the cycle the platform template once had (the API's 5xx alarm
/// rolling back intake's deployment: `HttpApi` → `IntakeFunctionAliaslive` → (UpdatePolicy)
/// `IntakeFunctionDeploymentGroup` → (alarms) `Api5xxAlarm` → (`ApiId`) `HttpApi`), put back
/// into a copy of today's template, fails it with E3004 on resources only SAM creates.
#[test]
fn a_dependency_cycle_through_sams_generated_resources_fails_the_lint() {
    let text = std::fs::read_to_string(Path::new(INFRA).join("template.yaml")).unwrap();
    let gate = "          - !Ref IntakeNewVersionErrorsAlarm\n";
    assert_eq!(text.matches(gate).count(), 1, "intake's rollback alarms, where the cycle went in");
    let cyclic = text.replacen(gate, &format!("{gate}          - !Ref Api5xxAlarm\n"), 1);
    let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join("template-with-cycle.yaml");
    std::fs::write(&path, cyclic).unwrap();
    let (findings, ok) = cfn_lint(&[path]);
    assert!(!ok, "cfn-lint exits non-zero");
    let cycles: Vec<&Value> = findings.iter().filter(|f| f["Rule"]["Id"] == "E3004").collect();
    let text = summary(&findings);
    assert!(!cycles.is_empty(), "E3004 reported: {text}");
    for generated in ["IntakeFunctionAliaslive", "IntakeFunctionDeploymentGroup"] {
        assert!(text.contains(generated), "the cycle runs through SAM's {generated}: {text}");
    }
}
