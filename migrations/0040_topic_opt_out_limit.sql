-- A tenant's topic opt-outs are bounded like its suppressions (`limits`): the kind an operator
-- may override. Additive: a CHECK widened, no row changed.
ALTER TABLE tenant_limits DROP CONSTRAINT tenant_limits_kind_check;
ALTER TABLE tenant_limits ADD CONSTRAINT tenant_limits_kind_check
    CHECK (kind IN ('destinations', 'templates', 'suppressions', 'topic_opt_outs', 'pending_jobs'));
