-- SPEC OPS-2 (issue 14 item 3): one append-only trail of every operator action.
-- Written by the action itself, in the transaction of the action's own write, so an
-- action that rolls back leaves no entry and a committed one always has its entry.
-- The trail is never pruned (OPS-3) and never rewritten: UPDATE, DELETE and TRUNCATE
-- are refused like the revalidation receipts' (CP003).

CREATE TABLE connector_operator_audit (
    audit_id     bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    recorded_at  timestamptz NOT NULL DEFAULT now(),
    operator     text        NOT NULL CHECK (operator <> ''),
    reason       text        NOT NULL,
    -- the CLI command: reconcile, supersede, retire, mark-terminal, revalidate-link,
    -- revalidate-apply, backfill-apply, pack-apply
    command      text        NOT NULL CHECK (command <> ''),
    -- null for an action on no single link (pack apply)
    link_key     text,
    -- the action's arguments (remote id, operation id, install id, ...)
    arguments    jsonb       NOT NULL DEFAULT '{}'::jsonb CHECK (jsonb_typeof(arguments) = 'object'),
    state_before jsonb,
    state_after  jsonb,
    outcome      text        NOT NULL
);

CREATE INDEX connector_operator_audit_link_ix
    ON connector_operator_audit (link_key, recorded_at) WHERE link_key IS NOT NULL;
CREATE INDEX connector_operator_audit_recorded_ix ON connector_operator_audit (recorded_at);

CREATE TRIGGER connector_operator_audit_append_only_tg
    BEFORE UPDATE OR DELETE ON connector_operator_audit
    FOR EACH ROW EXECUTE FUNCTION reject_append_only_write();
CREATE TRIGGER connector_operator_audit_no_truncate_tg
    BEFORE TRUNCATE ON connector_operator_audit
    FOR EACH STATEMENT EXECUTE FUNCTION reject_append_only_write();
