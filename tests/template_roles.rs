//! The SAM template's roles: each function and each task type its own, least privilege.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::json;

use crate::template::*;

#[test]
fn each_function_has_its_own_least_privilege_role() {
    let t = template();
    let set = |items: &[&str]| items.iter().map(|s| (*s).to_owned()).collect::<BTreeSet<String>>();
    // The executor and its long lane run the same code under one role (the task roles trust one principal).
    let executor = set(&[
        "logs:CreateLogStream ExecutorLogGroup",
        "logs:PutLogEvents ExecutorLogGroup",
        "logs:CreateLogStream LongExecutorLogGroup",
        "logs:PutLogEvents LongExecutorLogGroup",
        "secretsmanager:GetSecretValue DatabaseSecretArn",
        "sqs:ReceiveMessage WorkQueue",
        "sqs:DeleteMessage WorkQueue",
        "sqs:GetQueueAttributes WorkQueue",
        "sqs:SendMessage WorkQueue",
        "sqs:ReceiveMessage LongWorkQueue",
        "sqs:DeleteMessage LongWorkQueue",
        "sqs:GetQueueAttributes LongWorkQueue",
        "sqs:SendMessage LongWorkQueue",
        "sts:AssumeRole EmailSendTaskRole",
        "sts:TagSession EmailSendTaskRole",
        "sts:AssumeRole HttpRequestTaskRole",
        "sts:TagSession HttpRequestTaskRole",
        "sts:AssumeRole WebhookSendTaskRole",
        "sts:TagSession WebhookSendTaskRole",
        "sts:AssumeRole TenantTaskRoleArns",
        "sts:TagSession TenantTaskRoleArns",
    ]);
    let expected = [
        (
            "IntakeFunction",
            "IntakeRole",
            set(&[
                "logs:CreateLogStream IntakeLogGroup",
                "logs:PutLogEvents IntakeLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "sqs:SendMessage WorkQueue",
                "secretsmanager:CreateSecret arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/*/destinations/*",
                "secretsmanager:PutSecretValue arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/*/destinations/*",
                "secretsmanager:DeleteSecret arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/*/destinations/*",
            ]),
        ),
        ("ExecutorFunction", "ExecutorRole", executor.clone()),
        ("LongExecutorFunction", "ExecutorRole", executor),
        (
            "SweeperFunction",
            "SweeperRole",
            set(&[
                "logs:CreateLogStream SweeperLogGroup",
                "logs:PutLogEvents SweeperLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                // The SES account's send rate and quota: GetAccount has no resource-level permissions.
                "ses:GetAccount *",
                // Tenants' topic changes written to mapped SES contacts (contact lists only).
                "ses:GetContact arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:contact-list/*",
                "ses:UpdateContact arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:contact-list/*",
                "ses:CreateContact arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:contact-list/*",
                "sqs:SendMessage WorkQueue",
            ]),
        ),
        (
            "IngressFunction",
            "IngressRole",
            set(&[
                "logs:CreateLogStream IngressLogGroup",
                "logs:PutLogEvents IngressLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "sqs:ReceiveMessage IngressQueue",
                "sqs:DeleteMessage IngressQueue",
                "sqs:GetQueueAttributes IngressQueue",
                "sqs:SendMessage WorkQueue",
            ]),
        ),
        (
            "PreTrafficFunction",
            "PreTrafficRole",
            set(&[
                "logs:CreateLogStream PreTrafficLogGroup",
                "logs:PutLogEvents PreTrafficLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "lambda:InvokeFunction ${IntakeFunction.Arn}:*",
                "lambda:InvokeFunction ${ExecutorFunction.Arn}:*",
                "lambda:InvokeFunction ${LongExecutorFunction.Arn}:*",
                "lambda:InvokeFunction ${SweeperFunction.Arn}:*",
                "lambda:InvokeFunction ${IngressFunction.Arn}:*",
                "codedeploy:PutLifecycleEventHookExecutionStatus arn:${AWS::Partition}:codedeploy:${AWS::Region}:${AWS::AccountId}:deploymentgroup:${ServerlessDeploymentApplication}/*",
            ]),
        ),
        (
            "AdminFunction",
            "AdminRole",
            set(&[
                "logs:CreateLogStream AdminLogGroup",
                "logs:PutLogEvents AdminLogGroup",
                "secretsmanager:GetSecretValue DatabaseSecretArn",
                "sqs:ReceiveMessage WorkDeadLetterQueue",
                "sqs:DeleteMessage WorkDeadLetterQueue",
                "sqs:ReceiveMessage IngressDeadLetterQueue",
                "sqs:DeleteMessage IngressDeadLetterQueue",
                "sqs:SendMessage WorkQueue",
                "sqs:SendMessage IngressQueue",
            ]),
        ),
    ];
    assert_eq!(
        expected.iter().map(|(f, _, _)| (*f).to_owned()).collect::<BTreeSet<_>>(),
        functions(&t).keys().cloned().collect(),
        "every function's actions are listed here"
    );
    for (function, role, actions) in expected {
        let p = &t["Resources"][function]["Properties"];
        assert_eq!(target(&p["Role"]), role, "{function} has its own role");
        assert!(p.get("Policies").is_none(), "{function}: no SAM policy templates (they grant on *)");
        assert_eq!(role_actions(&t, role), actions, "{role}");
        let managed: Vec<String> =
            t["Resources"][role]["Properties"]["ManagedPolicyArns"].as_array().unwrap().iter().map(target).collect();
        assert_eq!(managed, ["VpcAccessPolicy", "XrayWritePolicy"], "{role}: VPC interfaces and tracing only");
    }
}

/// The one secret a task role may write: a destination's refresh token, rotated by its token
/// endpoint (put, not create), the session's own tenant's.
const ROTATED_REFRESH_TOKEN: &str = "secretsmanager:PutSecretValue arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/${!aws:PrincipalTag/relay:tenant}/destinations/*/refresh-token-??????";

#[test]
fn each_task_type_has_its_own_role_trusting_only_the_executor() {
    let t = template();
    let roles = task_roles(&t);
    assert!(!roles.is_empty());
    // Exactly the actions each task needs.
    let config_set = "arn:${AWS::Partition}:ses:${AWS::Region}:${AWS::AccountId}:configuration-set/${Name}";
    let expected: BTreeMap<&str, BTreeSet<String>> = [(
        "EmailSendTaskRole",
        [
            "ses:SendEmail SesIdentityArns".to_owned(),
            "ses:SendRawEmail SesIdentityArns".to_owned(),
            format!("ses:SendEmail {config_set}"),
            format!("ses:SendRawEmail {config_set}"),
        ]
        .into_iter()
        .collect(),
    ), (
        "HttpRequestTaskRole",
        // Only the session's own tenant's (the relay:tenant session tag, credentials/session.rs).
        [
            "secretsmanager:GetSecretValue arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/${!aws:PrincipalTag/relay:tenant}/destinations/*".to_owned(),
            ROTATED_REFRESH_TOKEN.to_owned(),
        ]
        .into_iter()
        .collect(),
    ), (
        "WebhookSendTaskRole",
        // The same: its destinations' auth and signing secrets, the session's own tenant's only.
        [
            "secretsmanager:GetSecretValue arn:${AWS::Partition}:secretsmanager:${AWS::Region}:${AWS::AccountId}:secret:relay/${AWS::StackName}/tenants/${!aws:PrincipalTag/relay:tenant}/destinations/*".to_owned(),
            ROTATED_REFRESH_TOKEN.to_owned(),
        ]
        .into_iter()
        .collect(),
    )]
    .into_iter()
    .collect();
    assert_eq!(roles.keys().map(String::as_str).collect::<BTreeSet<_>>(), expected.keys().copied().collect());
    let executor_may = role_actions(&t, "ExecutorRole");
    for (name, role) in &roles {
        let p = &role["Properties"];
        assert_eq!(role_actions(&t, name), expected[name.as_str()], "{name}");
        assert!(p.get("ManagedPolicyArns").is_none(), "{name}: no managed policies");
        assert!(num(&p["MaxSessionDuration"]) <= 3600, "{name}: chained sessions last at most an hour");
        let trust = p["AssumeRolePolicyDocument"]["Statement"].as_array().unwrap();
        assert_eq!(trust.len(), 1, "{name}: one trust statement");
        assert_eq!(trust[0]["Effect"], "Allow");
        assert_eq!(trust[0]["Principal"].as_object().unwrap().len(), 1, "{name}: one kind of principal");
        assert_eq!(target(&trust[0]["Principal"]["AWS"]), "ExecutorRole", "{name} trusts the executor's role only");
        assert_eq!(trust[0]["Action"], json!(["sts:AssumeRole", "sts:TagSession"]), "{name}: assume with session tags");
        assert!(executor_may.contains(&format!("sts:AssumeRole {name}")), "the executor may assume {name}");
    }
    // The executor's mapping names every task role and parses as the executor reads it.
    let vars = &t["Resources"]["ExecutorFunction"]["Properties"]["Environment"]["Variables"];
    let mapping = vars["RELAY_TASK_ROLES"]["Fn::Sub"].as_str().expect("RELAY_TASK_ROLES is a !Sub");
    let mut resolved = mapping.to_owned();
    for name in roles.keys() {
        assert!(mapping.contains(&format!("${{{name}.Arn}}")), "RELAY_TASK_ROLES maps {name}");
        resolved =
            resolved.replace(&format!("${{{name}.Arn}}"), &format!("arn:aws:iam::123456789012:role/stack-{name}-X1"));
    }
    let secs = vars["RELAY_TASK_SESSION_SECONDS"].as_str().unwrap().to_owned();
    let env = |k: &str| match k {
        "RELAY_TASK_ROLES" => Some(resolved.clone()),
        "RELAY_TASK_SESSION_SECONDS" => Some(secs.clone()),
        _ => None,
    };
    let parsed =
        taskdeck::credentials::TaskRoles::from_lookup(env).expect("the executor accepts the template's mapping");
    let anyone = taskdeck::job::TenantId::new();
    assert!(parsed.resolve(anyone, "email.send").is_some());
    assert!(parsed.resolve(anyone, "noop").is_none(), "default deny for everything else");
    assert_eq!(target(&vars["RELAY_TENANT_TASK_ROLES"]), "TenantTaskRoles");
}
