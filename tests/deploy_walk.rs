//! The runbook's walk from an empty account and back (deploy.md, "From an empty account"): the
//! shell blocks fenced `sh walk` and `sh walk-teardown`, taken from the page itself, run in one
//! shell with the real `sam` and `aws` CLIs against a moto server of this test's own
//! (`tests/support/moto_cfn.py`: moto with what its CloudFormation lacks). What is stood in and
//! what is not covered is listed in deploy.md, "What the walk runs against".

use std::collections::BTreeSet;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");
const REGION: &str = "eu-west-1";
const ACCOUNT: &str = "123456789012";

/// The resource types of both templates (SAM expanded) that moto's CloudFormation creates
/// nothing for, as deploy.md lists them.
const NOT_SERVED: [&str; 13] = [
    "AWS::ApiGatewayV2::Api",
    "AWS::ApiGatewayV2::Stage",
    "AWS::CloudWatch::Alarm",
    "AWS::CodeDeploy::Application",
    "AWS::CodeDeploy::DeploymentGroup",
    "AWS::Logs::MetricFilter",
    "AWS::S3::BucketPolicy",
    "AWS::SES::ConfigurationSet",
    "AWS::SES::ConfigurationSetEventDestination",
    "AWS::SNS::Subscription",
    "AWS::SNS::TopicPolicy",
    "AWS::SQS::QueuePolicy",
    "AWS::Scheduler::Schedule",
];

/// The shell blocks of deploy.md fenced as `sh <tag>`, in page order, placeholders filled.
fn blocks(tag: &str) -> String {
    let doc = std::fs::read_to_string(Path::new(ROOT).join("shared/docs/deploy.md")).expect("deploy.md");
    let mut out = String::new();
    let mut inside = false;
    for line in doc.lines() {
        if inside && line.trim() == "```" {
            inside = false;
        } else if inside {
            out.push_str(line);
            out.push('\n');
        } else if line.trim() == format!("```sh {tag}") {
            inside = true;
        }
    }
    assert!(!out.is_empty(), "deploy.md has blocks fenced `sh {tag}`");
    let out = out.replace("<region>", REGION).replace("<account>", ACCOUNT).replace("<domain>", "example.com");
    assert!(!out.contains(":<") && !out.contains("/<"), "a placeholder the walk does not fill: {out}");
    out
}

/// The venv with the pinned CLIs and moto (a new pin makes a new venv), made once per machine
/// (and by one test at a time).
fn venv() -> PathBuf {
    static VENV: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    VENV.get_or_init(make_venv).clone()
}

fn make_venv() -> PathBuf {
    let requirements = Path::new(ROOT).join("tests/support/walk-requirements.txt");
    let pins = std::fs::read_to_string(&requirements).expect("walk-requirements.txt");
    let python = crate::python::python();
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (pins.as_str(), python.to_string_lossy()).hash(&mut h);
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deploy-walk-venv-{:016x}", h.finish()));
    let req = requirements.to_string_lossy().into_owned();
    relay::localaws::venv_with(&python, &dir, &["-r", req.as_str()]).expect("the deploy walk's venv")
}

/// A working copy holding what the commands read (samconfig.toml, infra/), a moto of its own,
/// and the environment both CLIs run in.
struct Walk {
    dir: PathBuf,
    venv: PathBuf,
    endpoint: String,
    moto: Child,
}

impl Drop for Walk {
    fn drop(&mut self) {
        let _ = self.moto.kill();
        let _ = self.moto.wait();
    }
}

impl Walk {
    fn start() -> Walk {
        let venv = venv();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("deploy-walk-{}", uuid::Uuid::now_v7().simple()));
        std::fs::create_dir_all(dir.join("infra")).unwrap();
        std::fs::copy(Path::new(ROOT).join("samconfig.toml"), dir.join("samconfig.toml")).unwrap();
        for t in crate::lint::TEMPLATES {
            std::fs::copy(Path::new(ROOT).join("infra").join(t), dir.join("infra").join(t)).unwrap();
        }
        // What `sam build` leaves, with each function's code a stub (see `sam` in `run`).
        let template = std::fs::read_to_string(dir.join("infra/template.yaml")).unwrap();
        let functions = template.matches("Type: AWS::Serverless::Function").count();
        assert_eq!(
            template.matches("\n      CodeUri: ..\n").count(),
            functions,
            "every function's code is the repository"
        );
        let built = dir.join(".walk-build");
        std::fs::create_dir_all(built.join("stub")).unwrap();
        std::fs::write(
            built.join("template.yaml"),
            template.replace("\n      CodeUri: ..\n", "\n      CodeUri: stub\n"),
        )
        .unwrap();
        std::fs::write(built.join("stub/bootstrap"), "#!/bin/sh\nexit 1\n").unwrap();

        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = std::fs::File::create(dir.join("moto.log")).unwrap();
        let moto = Command::new(venv.join("bin/python"))
            .arg(Path::new(ROOT).join("tests/support/moto_cfn.py"))
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .env("AWS_DEFAULT_REGION", REGION)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("moto_cfn.py starts");
        relay::localaws::kill_when_process_exits(moto.id(), std::process::id()).expect("a watchdog");
        let walk = Walk { dir, venv, endpoint: format!("http://localhost:{port}"), moto };
        let deadline = Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_cfn.py did not listen: {}", walk.moto_log());
            std::thread::sleep(Duration::from_millis(200));
        }
        walk
    }

    fn moto_log(&self) -> String {
        std::fs::read_to_string(self.dir.join("moto.log")).unwrap_or_default()
    }

    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        let path = format!("{}:{}", self.venv.join("bin").display(), std::env::var("PATH").unwrap_or_default());
        for var in ["AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_LAMBDA", "AWS_ENDPOINT_URL_CODEDEPLOY"] {
            c.env_remove(var);
        }
        c.current_dir(&self.dir)
            .env("PATH", path)
            .env("HOME", &self.dir)
            .env("AWS_ENDPOINT_URL", &self.endpoint)
            .env("AWS_ACCESS_KEY_ID", "testing")
            .env("AWS_SECRET_ACCESS_KEY", "testing")
            .env("AWS_DEFAULT_REGION", REGION)
            .env("AWS_REGION", REGION)
            .env("AWS_CONFIG_FILE", self.dir.join("no-aws-config"))
            .env("AWS_SHARED_CREDENTIALS_FILE", self.dir.join("no-aws-credentials"))
            .env("SAM_CLI_TELEMETRY", "0")
            .env("SAM_CLI_POLL_DELAY", "0.2");
        c
    }

    /// Run `script` in bash, strict, `sam build` stood in, each `sam` answered `y` (its change
    /// set's confirmation; each gets its own, as Python reads all of a piped stdin at once).
    fn run(&self, script: &str) -> Output {
        let prelude = "set -euo pipefail\n\
            sam() { if [ \"$1\" = build ]; then rm -rf .aws-sam/build && mkdir -p .aws-sam && cp -r .walk-build .aws-sam/build; \
            else printf 'y\\n' | command sam \"$@\"; fi; }\n";
        self.command("bash")
            .arg("-c")
            .arg(format!("{prelude}{script}"))
            .stdin(Stdio::null())
            .output()
            .expect("bash runs")
    }

    /// `aws <args> --output json`, parsed.
    fn aws(&self, args: &[&str]) -> Value {
        let out = self.command("aws").args(args).args(["--output", "json"]).output().expect("aws runs");
        assert!(out.status.success(), "aws {}: {}", args.join(" "), report(&out));
        serde_json::from_slice(&out.stdout).unwrap_or(Value::Null)
    }

    fn stacks(&self) -> Vec<(String, String)> {
        let v = self.aws(&["cloudformation", "describe-stacks"]);
        v["Stacks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s["StackName"].as_str().unwrap().to_owned(), s["StackStatus"].as_str().unwrap().to_owned()))
            .filter(|(name, _)| name.starts_with("relay"))
            .collect()
    }

    /// The resource types moto's CloudFormation said it creates nothing for.
    fn not_served(&self) -> BTreeSet<String> {
        let marker = "No Moto CloudFormation support for ";
        self.moto_log().lines().filter_map(|l| l.split_once(marker).map(|(_, t)| t.trim().to_owned())).collect()
    }
}

fn report(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A stack's parameters; a list as CloudFormation gives it, comma-joined (moto answers a
/// Python list's text, `['a', 'b']`).
fn parameters(stack: &Value) -> Vec<(String, String)> {
    let list = stack["Parameters"].as_array().cloned().unwrap_or_default();
    let joined = |v: &str| match v.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        Some(items) => items.split(", ").map(|i| i.trim_matches('\'')).collect::<Vec<_>>().join(","),
        None => v.to_owned(),
    };
    list.iter()
        .map(|p| (p["ParameterKey"].as_str().unwrap().to_owned(), joined(p["ParameterValue"].as_str().unwrap_or(""))))
        .collect()
}

fn check_created(walk: &Walk) {
    let mut stacks = walk.stacks();
    stacks.sort();
    let complete = |n: &str| (n.to_owned(), "CREATE_COMPLETE".to_owned());
    assert_eq!(stacks, [complete("relay"), complete("relay-foundation")], "both stacks created");
    let foundation = walk.aws(&["cloudformation", "describe-stacks", "--stack-name", "relay-foundation"]);
    let platform = walk.aws(&["cloudformation", "describe-stacks", "--stack-name", "relay"]);
    let outputs = foundation["Stacks"][0]["Outputs"].as_array().cloned().unwrap_or_default();
    assert_eq!(outputs.len(), 8, "the foundation's outputs: {foundation}");
    let given = parameters(&platform["Stacks"][0]);
    for o in &outputs {
        let (key, value) = (o["OutputKey"].as_str().unwrap(), o["OutputValue"].as_str().unwrap());
        assert!(
            given.iter().any(|(k, v)| k == key && v == value),
            "the platform's {key} is the foundation's ({value}): {given:?}"
        );
    }
    let secret_arn = &given.iter().find(|(k, _)| k == "DatabaseSecretArn").unwrap().1;
    let secret = walk.aws(&["secretsmanager", "get-secret-value", "--secret-id", secret_arn]);
    let login: Value = serde_json::from_str(secret["SecretString"].as_str().unwrap()).unwrap();
    assert!(login["password"].is_string(), "the managed secret holds the login");
    let proxies = walk.aws(&["rds", "describe-db-proxies"]);
    let proxy = &proxies["DBProxies"][0];
    assert_eq!(proxy["RequireTLS"], true, "{proxies}");
    let endpoint = &given.iter().find(|(k, _)| k == "DatabaseProxyEndpoint").unwrap().1;
    assert_eq!(proxy["Endpoint"].as_str(), Some(endpoint.as_str()), "the functions reach the proxy");
    let hook = walk.aws(&["lambda", "get-function", "--function-name", "CodeDeployHook_relay-pretraffic"]);
    assert_eq!(hook["Configuration"]["Runtime"], "provided.al2023", "{hook}");
    let functions = walk.aws(&["lambda", "list-functions"]);
    let names: BTreeSet<&str> =
        functions["Functions"].as_array().unwrap().iter().filter_map(|f| f["FunctionName"].as_str()).collect();
    assert_eq!(names.len(), 7, "seven functions: {names:?}");
    for live in ["relay-intake", "relay-executor", "relay-executor-long", "relay-sweeper", "relay-ingress"] {
        walk.aws(&["lambda", "get-alias", "--function-name", live, "--name", "live"]);
    }
    let expected: BTreeSet<String> = NOT_SERVED.iter().map(|t| (*t).to_owned()).collect();
    assert_eq!(walk.not_served(), expected, "what moto's CloudFormation creates nothing for (deploy.md lists it)");
}

/// deploy.md's commands, in order, from an empty account to both stacks and back to empty.
#[test]
fn the_runbooks_walk_creates_the_foundation_and_the_platform_and_tears_both_down() {
    let walk = Walk::start();
    let started = Instant::now();
    let out = walk.run(&blocks("walk"));
    assert!(out.status.success(), "the walk failed:\n{}\nmoto:\n{}", report(&out), walk.moto_log());
    check_created(&walk);
    let out = walk.run(&blocks("walk-teardown"));
    assert!(out.status.success(), "the teardown failed:\n{}\nmoto:\n{}", report(&out), walk.moto_log());
    assert_eq!(walk.stacks(), Vec::<(String, String)>::new(), "no stack left");
    assert_eq!(walk.aws(&["rds", "describe-db-instances"])["DBInstances"], serde_json::json!([]));
    assert_eq!(walk.aws(&["rds", "describe-db-proxies"])["DBProxies"], serde_json::json!([]));
    assert_eq!(walk.aws(&["lambda", "list-functions"])["Functions"], serde_json::json!([]));
    eprintln!("deploy walk: {:.1} s (moto started before)", started.elapsed().as_secs_f64());
}

/// The walk can fail: a parameter the platform does not declare (one letter off) leaves the
/// required one unset, and CloudFormation's check refuses the change set.
#[test]
fn a_wrong_parameter_name_in_the_walk_fails_it() {
    let walk = Walk::start();
    let script = blocks("walk");
    assert_eq!(script.matches("SesIdentityArns=").count(), 1);
    let out = walk.run(&script.replace("SesIdentityArns=", "SesIdentityArn="));
    assert!(!out.status.success(), "the walk passed with a wrong parameter name:\n{}", report(&out));
    assert!(report(&out).contains("SesIdentityArns"), "the error names the parameter: {}", report(&out));
}
