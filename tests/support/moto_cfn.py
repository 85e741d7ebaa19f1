"""moto's server, with what its CloudFormation lacks for the deploy walk (tests/deploy_walk.rs).

Each addition is what CloudFormation itself does, and nothing more; the walk's report lists them
(shared/docs/deploy.md, "What the walk runs against"):

1. the SAM transform runs service-side (CloudFormation expands AWS::Serverless-2016-10-31; moto
   does not, and would create none of the platform's functions);
2. a change set's parameters are checked as CloudFormation checks them: no parameter the
   template does not declare, AllowedValues and AllowedPattern held (moto checks only that
   parameters without a default are given);
3. a stack created or updated by executing a change set (what `sam deploy` does) has its outputs
   (moto computes them only on CreateStack/UpdateStack);
4. an RDS instance with ManageMasterUserPassword gets RDS's managed secret and its
   MasterUserSecret.SecretArn attribute (moto's CloudFormation drops the property);
5. AWS::RDS::DBProxy and AWS::RDS::DBProxyTargetGroup create the proxy and register its target
   through moto's own RDS API (moto's CloudFormation skips both);
6. AWS::Lambda::Alias creates the alias through moto's Lambda API (moto's CloudFormation skips
   it, and every resource naming the alias `live` fails), and AWS::Lambda::Version has its
   `Version` attribute and its ARN as its Ref (moto's has neither);
7. `Ref: AWS::NoValue` in a list removes the item (moto leaves a null there, which its IAM then
   refuses as a malformed policy).

Run as `python moto_cfn.py -H 127.0.0.1 -p PORT`, from a venv holding moto[server] and
aws-sam-translator.
"""

import copy
import re
import sys

from moto.cloudformation import models, parsing
from moto.awslambda import models as awslambda
from moto.cloudformation.exceptions import ValidationError
from moto.rds import models as rds
from samtranslator.translator.transform import transform

SAM = "AWS::Serverless-2016-10-31"


class _NoManagedPolicies:
    def load(self):
        return {}


def _expand(template):
    """1. The SAM transform, as CloudFormation runs it on a template that names it."""
    if not isinstance(template, dict):
        return template
    names = template.get("Transform")
    names = names if isinstance(names, list) else [names]
    if SAM not in names:
        return template
    return transform(copy.deepcopy(template), {}, _NoManagedPolicies())


_stack_parse = models.Stack.parse_template
models.Stack.parse_template = staticmethod(lambda text: _expand(_stack_parse(text)))
_change_set_parse = models.ChangeSet._parse_template


def _parse_change_set(self):
    _change_set_parse(self)
    self.template_dict = _expand(self.template_dict)


models.ChangeSet._parse_template = _parse_change_set


def _check_parameters(template, given):
    """2. CloudFormation's checks of the values a change set is given."""
    declared = template.get("Parameters", {}) if isinstance(template, dict) else {}
    unknown = sorted(set(given) - set(declared))
    if unknown:
        raise ValidationError(message=f"Parameters: {unknown} do not exist in the template")
    for name, value in given.items():
        slot = declared[name]
        values = value.split(",") if slot.get("Type", "").startswith(("List", "CommaDelimitedList")) else [value]
        allowed = slot.get("AllowedValues")
        pattern = slot.get("AllowedPattern")
        for v in values:
            if allowed is not None and v not in [str(a) for a in allowed]:
                raise ValidationError(message=f"Parameter '{name}' must be one of AllowedValues")
            if pattern is not None and not re.fullmatch(pattern, v):
                raise ValidationError(message=f"Parameter '{name}' must match pattern {pattern}")


_create_change_set = models.CloudFormationBackend.create_change_set


def _create_checked_change_set(self, stack_name, change_set_name, template, parameters, *args, **kwargs):
    _check_parameters(models.Stack.parse_template(template), parameters or {})
    return _create_change_set(self, stack_name, change_set_name, template, parameters, *args, **kwargs)


models.CloudFormationBackend.create_change_set = _create_checked_change_set
_execute_change_set = models.CloudFormationBackend.execute_change_set


def _execute_with_outputs(self, change_set_name, stack_name=None):
    """3. The executed change set's template is the stack's, outputs included."""
    _execute_change_set(self, change_set_name, stack_name)
    for stack in self.stacks.values():
        if stack.name == stack_name or stack.stack_id == stack_name or stack_name is None:
            stack._parse_template()
            stack.output_map = stack._create_output_map()


models.CloudFormationBackend.execute_change_set = _execute_with_outputs

# 4. RDS's managed master secret.
_instance_from_cfn = rds.DBInstance.create_from_cloudformation_json.__func__


def _instance_with_managed_secret(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
    db = _instance_from_cfn(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs)
    if cloudformation_json["Properties"].get("ManageMasterUserPassword") in (True, "true"):
        db.manage_master_user_password = True
        db.master_user_secret = rds.MasterUserSecret(db, None)
    return db


rds.DBInstance.create_from_cloudformation_json = classmethod(_instance_with_managed_secret)
_instance_attribute = rds.DBInstance.get_cfn_attribute


def _instance_attribute_with_secret(self, name):
    if name == "MasterUserSecret.SecretArn" and getattr(self, "master_user_secret", None):
        return self.master_user_secret.secret.arn
    return _instance_attribute(self, name)


rds.DBInstance.get_cfn_attribute = _instance_attribute_with_secret


# 5. RDS Proxy, through moto's RDS API.
class _Created:
    """What a CloudFormation resource is to moto's stack: a physical id, attributes, a delete."""

    def __init__(self, physical_id, attributes, delete):
        self.physical_resource_id = physical_id
        self._attributes = attributes
        self._delete = delete

    def get_cfn_attribute(self, name):
        return self._attributes[name]

    def delete(self, account_id, region_name):
        try:
            self._delete()
        except Exception:  # noqa: BLE001 - gone with what it belonged to (an alias with its function)
            pass


class _Proxy:
    @staticmethod
    def cloudformation_type():
        return "AWS::RDS::DBProxy"

    @classmethod
    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        p = cloudformation_json["Properties"]
        backend = rds.rds_backends[account_id][region_name]
        proxy = backend.create_db_proxy(
            db_proxy_name=p.get("DBProxyName", resource_name),
            engine_family=p["EngineFamily"],
            auth=p["Auth"],
            role_arn=p["RoleArn"],
            vpc_subnet_ids=p["VpcSubnetIds"],
            vpc_security_group_ids=p.get("VpcSecurityGroupIds"),
            require_tls=p.get("RequireTLS"),
            idle_client_timeout=p.get("IdleClientTimeout"),
            debug_logging=p.get("DebugLogging"),
            tags=p.get("Tags"),
        )
        name = proxy.db_proxy_name
        return _Created(
            name,
            {"Endpoint": proxy.endpoint, "DBProxyArn": proxy.arn},
            lambda: backend.db_proxies.pop(name, None),
        )


class _ProxyTargets:
    @staticmethod
    def cloudformation_type():
        return "AWS::RDS::DBProxyTargetGroup"

    @classmethod
    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        p = cloudformation_json["Properties"]
        backend = rds.rds_backends[account_id][region_name]
        proxy, group = p["DBProxyName"], p.get("TargetGroupName", "default")
        backend.register_db_proxy_targets(
            proxy, group, p.get("DBClusterIdentifiers", []), p.get("DBInstanceIdentifiers", [])
        )
        return _Created(f"{proxy}/{group}", {}, lambda: None)


class _Alias:
    @staticmethod
    def cloudformation_type():
        return "AWS::Lambda::Alias"

    @classmethod
    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        p = cloudformation_json["Properties"]
        backend = awslambda.lambda_backends[account_id][region_name]
        function = p["FunctionName"].split(":function:")[-1]
        alias = backend.create_alias(p["Name"], function, p["FunctionVersion"], p.get("Description", ""), None)
        return _Created(alias.arn, {}, lambda: backend.delete_alias(p["Name"], function))


class _Version:
    @staticmethod
    def cloudformation_type():
        return "AWS::Lambda::Version"

    @classmethod
    def create_from_cloudformation_json(cls, resource_name, cloudformation_json, account_id, region_name, **kwargs):
        function = cloudformation_json["Properties"]["FunctionName"].split(":function:")[-1]
        published = awslambda.lambda_backends[account_id][region_name].publish_version(function)
        arn = f"arn:aws:lambda:{region_name}:{account_id}:function:{function}:{published.version}"
        return _Created(arn, {"Version": str(published.version)}, lambda: None)


_clean_json = parsing.clean_json


def _clean_json_without_novalue(resource_json, resources_map):
    """7. An item that resolves to AWS::NoValue leaves its list."""
    cleaned = _clean_json(resource_json, resources_map)
    if isinstance(resource_json, list) and isinstance(cleaned, list):
        return [c for c, raw in zip(cleaned, resource_json) if c is not None or raw is None]
    return cleaned


parsing.clean_json = _clean_json_without_novalue

_EXTRA = {m.cloudformation_type(): m for m in (_Proxy, _ProxyTargets, _Alias, _Version)}
_class_from_type = parsing.resource_class_from_type
parsing.resource_class_from_type = lambda t: _EXTRA.get(t) or _class_from_type(t)

if __name__ == "__main__":
    from moto.server import main

    sys.exit(main(sys.argv[1:]))
