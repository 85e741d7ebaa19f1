//! The template's IAM policies evaluated, not just read: moto does not enforce IAM, so each
//! policy is resolved from the template (parameters and pseudo parameters given sample values,
//! as CloudFormation would substitute them) and evaluated by `support::iam` (the evaluation
//! rules written out there, and checked here first). The names Relay's code builds (the
//! destination secret path) are the ones evaluated, so the code and the policy cannot drift.

use std::collections::BTreeMap;

use serde_json::{Value, json};
use taskdeck::job::TenantId;

use crate::support::iam::{self, Decision, Request};
use crate::template::template;

const ACCOUNT: &str = "123456789012";
const REGION: &str = "us-east-1";
const STACK: &str = "relay";

/// Values for the template's parameters and resources as one stack sees them.
struct Stack {
    params: BTreeMap<&'static str, Value>,
    conditions: BTreeMap<&'static str, bool>,
}

impl Stack {
    fn new() -> Stack {
        let params = [
            (
                "SesIdentityArns",
                json!([identity("shop-a.example"), identity("shop-b.example"), identity("untagged.example")]),
            ),
            ("SesConfigurationSetName", json!("")),
            ("SesEventTopicArn", json!("")),
        ]
        .into_iter()
        .collect();
        let conditions = [("CreateSesConfigurationSet", true), ("CreateSesEventTopic", true)].into_iter().collect();
        Stack { params, conditions }
    }

    fn pseudo(&self, name: &str) -> Option<String> {
        Some(
            match name {
                "AWS::Partition" => "aws",
                "AWS::Region" => REGION,
                "AWS::AccountId" => ACCOUNT,
                "AWS::StackName" => STACK,
                "AWS::URLSuffix" => "amazonaws.com",
                _ => return None,
            }
            .to_owned(),
        )
    }

    /// A resource's `Ref` (its physical name or ARN as these tests name them).
    fn reference(&self, name: &str) -> Value {
        if let Some(v) = self.params.get(name) {
            return v.clone();
        }
        if let Some(p) = self.pseudo(name) {
            return json!(p);
        }
        match name {
            "SesEventTopic" => json!(format!("arn:aws:sns:{REGION}:{ACCOUNT}:{STACK}-ses-events")),
            "SesConfigurationSet" => json!(format!("{STACK}-events")),
            _ => json!(format!("{STACK}-{name}")),
        }
    }

    fn attribute(&self, resource: &str, attr: &str) -> String {
        format!("arn:aws:{attr}:{REGION}:{ACCOUNT}:{STACK}-{resource}")
    }

    /// The value CloudFormation would put in place of `v`.
    fn resolve(&self, v: &Value) -> Value {
        match v {
            Value::Array(a) => Value::Array(a.iter().map(|x| self.resolve(x)).collect()),
            Value::Object(o) if o.len() == 1 => {
                let (k, arg) = o.iter().next().unwrap();
                match k.as_str() {
                    "Ref" => self.reference(arg.as_str().unwrap()),
                    "Fn::If" => {
                        let cond = arg[0].as_str().unwrap();
                        let holds = *self.conditions.get(cond).unwrap_or_else(|| panic!("condition {cond}"));
                        self.resolve(&arg[if holds { 1 } else { 2 }])
                    }
                    "Fn::GetAtt" => {
                        let (r, a) = match arg.as_str() {
                            Some(s) => s.split_once('.').unwrap(),
                            None => (arg[0].as_str().unwrap(), arg[1].as_str().unwrap()),
                        };
                        json!(self.attribute(r, a))
                    }
                    "Fn::Sub" => {
                        let (text, vars) = match arg {
                            Value::String(s) => (s.as_str(), BTreeMap::new()),
                            _ => (
                                arg[0].as_str().unwrap(),
                                arg[1].as_object().unwrap().iter().map(|(k, v)| (k.clone(), self.resolve(v))).collect(),
                            ),
                        };
                        json!(self.sub(text, &vars))
                    }
                    _ => Value::Object(o.iter().map(|(k, v)| (k.clone(), self.resolve(v))).collect()),
                }
            }
            Value::Object(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), self.resolve(v))).collect()),
            other => other.clone(),
        }
    }

    /// `Fn::Sub`: `${X}` replaced, `${!X}` left as the literal `${X}` (an IAM policy variable).
    fn sub(&self, text: &str, vars: &BTreeMap<String, Value>) -> String {
        let mut out = String::new();
        let mut rest = text;
        while let Some(at) = rest.find("${") {
            out.push_str(&rest[..at]);
            let end = at + rest[at..].find('}').unwrap();
            let name = &rest[at + 2..end];
            if let Some(literal) = name.strip_prefix('!') {
                out.push_str(&format!("${{{literal}}}"));
            } else if let Some(v) = vars.get(name) {
                out.push_str(v.as_str().unwrap());
            } else if let Some((r, a)) = name.split_once('.') {
                out.push_str(&self.attribute(r, a));
            } else {
                out.push_str(self.reference(name).as_str().unwrap_or_else(|| panic!("${{{name}}} is a string")));
            }
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    /// Every statement of a role's inline policies, resolved.
    fn role_statements(&self, role: &str) -> Vec<Value> {
        let t = template();
        let policies = t["Resources"][role]["Properties"]["Policies"].as_array().unwrap_or_else(|| panic!("{role}"));
        let statements = policies.iter().flat_map(|p| p["PolicyDocument"]["Statement"].as_array().unwrap().clone());
        statements.map(|s| self.resolve(&s)).collect()
    }

    /// A resource policy's statements, resolved.
    fn resource_policy(&self, resource: &str) -> Vec<Value> {
        let t = template();
        let doc = &t["Resources"][resource]["Properties"]["PolicyDocument"]["Statement"];
        doc.as_array().unwrap().iter().map(|s| self.resolve(s)).collect()
    }

    /// The variable a function is given, resolved.
    fn env(&self, function: &str, name: &str) -> String {
        let t = template();
        let own = &t["Resources"][function]["Properties"]["Environment"]["Variables"][name];
        let v = if own.is_null() { &t["Globals"]["Function"]["Environment"]["Variables"][name] } else { own };
        self.resolve(v).as_str().unwrap_or_else(|| panic!("{function}: {name}")).to_owned()
    }
}

fn identity(domain: &str) -> String {
    format!("arn:aws:ses:{REGION}:{ACCOUNT}:identity/{domain}")
}

fn secret_arn(name: &str) -> String {
    // Secrets Manager appends six random characters to a secret's ARN.
    format!("arn:aws:secretsmanager:{REGION}:{ACCOUNT}:secret:{name}-AbCdEf")
}

#[test]
fn the_policy_evaluator_follows_the_rules_it_states() {
    iam::self_check();
}

/// `email.send` under a tenant's session sends only from identities tagged with that tenant:
/// another tenant's identity, an untagged one, or a session without the tag is refused. The
/// configuration set the send names is authorized too (SES checks both resources).
#[test]
fn an_email_send_session_cannot_send_from_another_tenants_identity() {
    let stack = Stack::new();
    let policy = stack.role_statements("EmailSendTaskRole");
    let (a, b) = (TenantId::new().to_string(), TenantId::new().to_string());
    let tag_of = |domain: &str| match domain {
        "shop-a.example" => Some(a.as_str()),
        "shop-b.example" => Some(b.as_str()),
        _ => None,
    };
    let config_set = format!("arn:aws:ses:{REGION}:{ACCOUNT}:configuration-set/{STACK}-events");
    // The session tags the executor sets (credentials/session.rs), for tenant `a`.
    let session =
        taskdeck::credentials::session::session_tags(a.parse().unwrap(), "email.send", taskdeck::job::JobId::new(), 1);
    let session_tenant = session.iter().find(|(k, _)| *k == "relay:tenant").map(|(_, v)| v.clone()).unwrap();
    let send = |from: &str, tagged_session: bool, action: &str| {
        let mut ctx: Vec<(String, String)> = Vec::new();
        if tagged_session {
            ctx.push(("aws:PrincipalTag/relay:tenant".into(), session_tenant.clone()));
        }
        let mut on_identity = ctx.clone();
        if let Some(t) = tag_of(from) {
            on_identity.push(("aws:ResourceTag/relay:tenant".into(), t.to_owned()));
        }
        let req = |res: &str, c: &[(String, String)]| Request {
            action: action.to_owned(),
            resource: res.to_owned(),
            context: c.iter().cloned().collect(),
        };
        iam::allows_all(&policy, &[req(&identity(from), &on_identity), req(&config_set, &ctx)])
    };
    for action in ["ses:SendEmail", "ses:SendRawEmail"] {
        assert!(send("shop-a.example", true, action), "{action}: its own identity");
        assert!(!send("shop-b.example", true, action), "{action}: another tenant's identity is an access denial");
        assert!(!send("untagged.example", true, action), "{action}: an identity of no tenant");
        assert!(!send("shop-a.example", false, action), "{action}: a session without the tenant tag");
        assert!(!send("elsewhere.example", true, action), "{action}: an identity outside SesIdentityArns");
    }
    let other = Request::new("ses:SendBulkEmail", &identity("shop-a.example"), &[]);
    assert_eq!(iam::evaluate(&policy, &other), Decision::ImplicitDeny, "nothing but the two sends");
}

/// The sweeper writes tenants' topic changes to SES contacts (`maintenance::ses_contacts`): it
/// may read, update and create a contact of this account's contact lists, nothing more of SES
/// than that and `GetAccount`; another account's list is out of reach.
#[test]
fn the_sweeper_writes_contacts_of_this_accounts_contact_lists_only() {
    let stack = Stack::new();
    let policy = stack.role_statements("SweeperRole");
    let list = format!("arn:aws:ses:{REGION}:{ACCOUNT}:contact-list/members");
    for action in ["ses:GetContact", "ses:UpdateContact", "ses:CreateContact"] {
        assert_eq!(iam::evaluate(&policy, &Request::new(action, &list, &[])), Decision::Allow, "{action}");
        let elsewhere = "arn:aws:ses:us-east-1:210987654321:contact-list/members";
        assert_eq!(iam::evaluate(&policy, &Request::new(action, elsewhere, &[])), Decision::ImplicitDeny, "{action}");
    }
    for action in ["ses:DeleteContact", "ses:DeleteContactList", "ses:SendEmail"] {
        assert_eq!(iam::evaluate(&policy, &Request::new(action, &list, &[])), Decision::ImplicitDeny, "{action}");
    }
}

/// The destination secret path the code builds (`destinations::secret_id_under`, with the root
/// the template gives the functions) is what the roles allow: the task roles read only their
/// session's tenant's, intake writes only under its own stack; another stack's path, though its
/// name starts with this one's, is out of reach.
#[test]
fn destination_secrets_are_reached_only_in_this_stack_and_by_their_own_tenant() {
    let stack = Stack::new();
    let root = stack.env("IntakeFunction", "RELAY_SECRET_ROOT");
    assert_eq!(root, format!("relay/{STACK}"), "the root names the stack");
    for f in ["ExecutorFunction", "LongExecutorFunction"] {
        assert_eq!(stack.env(f, "RELAY_SECRET_ROOT"), root, "{f} reads where intake writes");
    }
    assert!(taskdeck::destinations::check_secret_root(&root).is_ok(), "the functions accept it");
    let (a, b) = (TenantId::new(), TenantId::new());
    let path = |root: &str, t: TenantId, signing: bool| {
        let id = taskdeck::destinations::secret_id_under(root, t, "crm");
        secret_arn(&if signing { format!("{id}/signing") } else { id })
    };
    let neighbour = format!("relay/{STACK}-staging");
    for role in ["HttpRequestTaskRole", "WebhookSendTaskRole"] {
        let policy = stack.role_statements(role);
        let read = |res: String, tenant: Option<TenantId>| {
            let tag = tenant.map(|t| t.to_string());
            let ctx: Vec<(&str, &str)> =
                tag.as_deref().map(|t| vec![("aws:PrincipalTag/relay:tenant", t)]).unwrap_or_default();
            iam::evaluate(&policy, &Request::new("secretsmanager:GetSecretValue", &res, &ctx))
        };
        assert_eq!(read(path(&root, a, false), Some(a)), Decision::Allow, "{role}: its own tenant's secret");
        assert_eq!(read(path(&root, a, true), Some(a)), Decision::Allow, "{role}: and its signing secret");
        assert_eq!(read(path(&root, b, false), Some(a)), Decision::ImplicitDeny, "{role}: another tenant's");
        assert_eq!(read(path(&root, a, false), None), Decision::ImplicitDeny, "{role}: an untagged session");
        assert_eq!(read(path(&neighbour, a, false), Some(a)), Decision::ImplicitDeny, "{role}: another stack's");
        // It may put a rotated refresh token of its own tenant's, and write nothing else.
        let write = |action: &str, res: String, t: TenantId| {
            let tag = t.to_string();
            iam::evaluate(&policy, &Request::new(action, &res, &[("aws:PrincipalTag/relay:tenant", tag.as_str())]))
        };
        let refresh = |t: TenantId| {
            secret_arn(&format!("{}/refresh-token", taskdeck::destinations::secret_id_under(&root, t, "cal")))
        };
        let put = "secretsmanager:PutSecretValue";
        assert_eq!(write(put, refresh(a), a), Decision::Allow, "{role}: its tenant's rotated refresh token");
        assert_eq!(write(put, refresh(b), a), Decision::ImplicitDeny, "{role}: another tenant's");
        assert_eq!(write(put, path(&root, a, false), a), Decision::ImplicitDeny, "{role}: the auth secret");
        assert_eq!(write(put, path(&root, a, true), a), Decision::ImplicitDeny, "{role}: the signing secret");
        let created = write("secretsmanager:CreateSecret", refresh(a), a);
        assert_eq!(created, Decision::ImplicitDeny, "{role}: creates none");
    }
    let intake = stack.role_statements("IntakeRole");
    for action in ["secretsmanager:CreateSecret", "secretsmanager:PutSecretValue"] {
        let write = |res: String| iam::evaluate(&intake, &Request::new(action, &res, &[]));
        assert_eq!(write(path(&root, a, false)), Decision::Allow, "intake {action} in its stack");
        assert_eq!(write(path(&neighbour, a, false)), Decision::ImplicitDeny, "intake {action} in another stack");
        assert_eq!(write(secret_arn("relay/tenants/x/destinations/y")), Decision::ImplicitDeny, "the unscoped path");
    }
    let read = Request::new("secretsmanager:GetSecretValue", &path(&root, a, false), &[]);
    assert_eq!(iam::evaluate(&intake, &read), Decision::ImplicitDeny, "intake never reads them");
}

/// The ingress queue accepts SNS deliveries from the SES event topic and this stack's own
/// `<stack>_*` topics only: not another stack's (`relay-staging_inbound` beside `relay`), not
/// another account's.
#[test]
fn the_ingress_queue_accepts_only_this_stacks_topics() {
    let stack = Stack::new();
    let policy = stack.resource_policy("IngressQueuePolicy");
    for s in &policy {
        assert_eq!(s["Principal"], json!({"Service": "sns.amazonaws.com"}), "SNS delivers, nothing else: {s}");
    }
    let queue = stack.attribute("IngressQueue", "Arn");
    let from = |topic: String| {
        iam::evaluate(&policy, &Request::new("sqs:SendMessage", &queue, &[("aws:SourceArn", topic.as_str())]))
    };
    let topic = |account: &str, name: &str| format!("arn:aws:sns:{REGION}:{account}:{name}");
    assert_eq!(from(topic(ACCOUNT, &format!("{STACK}-ses-events"))), Decision::Allow, "the SES event topic");
    assert_eq!(from(topic(ACCOUNT, &format!("{STACK}_inbound"))), Decision::Allow, "this stack's own topic");
    for (account, name) in [
        (ACCOUNT, format!("{STACK}-staging_inbound")),
        (ACCOUNT, "relay-inbound".to_owned()),
        ("210987654321", format!("{STACK}_inbound")),
    ] {
        assert_eq!(from(topic(account, &name)), Decision::ImplicitDeny, "{account}:{name}");
    }
    assert_eq!(
        iam::evaluate(&policy, &Request::new("sqs:SendMessage", &queue, &[])),
        Decision::ImplicitDeny,
        "no source, no delivery"
    );
}
