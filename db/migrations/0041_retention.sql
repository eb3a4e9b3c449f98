-- SPEC OPS-3 (issue 14 item 8): retention may delete what is finished, and only that.
-- `connector-push prune` (db/retention.py) chooses by age; these guards are the line no
-- code path can cross whatever it chooses:
--   * an ingress receipt may be deleted only once its event is finished (or it has
--     none) and no unfinished workflow action execution names it; UPDATE stays refused;
--   * an event may be deleted only once finished (processed, skipped, dead);
--   * a workflow action execution only once delivered or stopped.
-- Links, attempts, unfinished PATCHes and their journal rows (0010, CP004), revalidation
-- receipts and the audit trail (CP003) keep their own refusals, unchanged.

CREATE OR REPLACE FUNCTION ingress_receipt_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE'
       AND (OLD.event_id IS NULL
            OR EXISTS (SELECT 1 FROM connector_event e
                       WHERE e.event_id = OLD.event_id AND e.status <> 'admitted'))
       AND NOT EXISTS (SELECT 1 FROM workflow_action_execution x
                       WHERE x.receipt_id = OLD.receipt_id
                         AND x.phase NOT IN ('delivered', 'stopped')) THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'ingress_receipt is append-only (% rejected; only a receipt of finished '
        'work may be pruned)', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER ingress_receipt_no_truncate
    BEFORE TRUNCATE ON ingress_receipt
    FOR EACH STATEMENT EXECUTE FUNCTION ingress_receipt_append_only();

CREATE FUNCTION connector_event_retention_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.status <> 'admitted' THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'connector_event: % of an admitted (unprocessed) event is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER connector_event_retention_guard_tg
    BEFORE DELETE ON connector_event
    FOR EACH ROW EXECUTE FUNCTION connector_event_retention_guard();
CREATE TRIGGER connector_event_no_truncate_tg
    BEFORE TRUNCATE ON connector_event
    FOR EACH STATEMENT EXECUTE FUNCTION connector_event_retention_guard();

CREATE FUNCTION workflow_action_execution_retention_guard() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' AND OLD.phase IN ('delivered', 'stopped') THEN
        RETURN OLD;
    END IF;
    RAISE EXCEPTION 'workflow_action_execution: % of an unfinished execution is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END;
$$;

CREATE TRIGGER workflow_action_execution_retention_guard_tg
    BEFORE DELETE ON workflow_action_execution
    FOR EACH ROW EXECUTE FUNCTION workflow_action_execution_retention_guard();
CREATE TRIGGER workflow_action_execution_no_truncate_tg
    BEFORE TRUNCATE ON workflow_action_execution
    FOR EACH STATEMENT EXECUTE FUNCTION workflow_action_execution_retention_guard();

-- Age scans for the pruner.
CREATE INDEX connector_event_finished_ix ON connector_event (updated_at) WHERE status <> 'admitted';
CREATE INDEX ingress_receipt_received_ix ON ingress_receipt (received_at);
CREATE INDEX connector_patch_dispatch_newest_ix
    ON connector_patch_dispatch (link_key, created_at DESC, patch_id DESC);
