-- S-5 operator identity and S-7 erasure of a record's values.
--
-- S-5: beside the operator an entry declares, the audit trail records what the system
-- knows. Postgres fills the database role (current_user), the login (session_user) and
-- the client address (NULL over a Unix socket) itself, whatever the INSERT says, so no
-- role can claim another's. The process supplies its host name and, for an action that
-- came as a Temporal update (the Web UI, the CLI), the update's client identity as the
-- Temporal server recorded it (db/audit.py, services/update_identity.py).
--
-- S-7: `connector-push forget` (services/forget.py) erases a record's values from the
-- rows that hold them, keeping the hashes and the evidence that requests were sent.
-- Its only way in is one column per table, `values_erased_at`: the statement sets it
-- and nothing else, and the trigger below (named to fire after every other BEFORE
-- UPDATE trigger of its table, which see an unchanged row) replaces the values with
-- the marker. So the evidence guards of 0010 and 0041 stay as they are for every
-- other write, and no other statement can use the path:
--   * only a member of connector_push_operator may set it (superusers are members);
--   * it is set once, never cleared, and the erased values stay erased;
--   * the statement may change nothing else (`updated_at` aside, the touch trigger's);
--   * only finished rows: an attempt or PATCH that may still be sent, an event not yet
--     processed or an unfinished workflow action keeps its values (forget refuses).
-- Attempts keep `request_snapshot.body_hash`, PATCHes `body_fingerprint` (the sha256
-- of the bytes sent); inbox rows keep the sha256 of the erased payload.

-- -- S-5 ---------------------------------------------------------------------------------

ALTER TABLE connector_operator_audit
    ADD COLUMN db_role           text,
    ADD COLUMN db_session_user   text,
    ADD COLUMN db_client_addr    inet,
    ADD COLUMN host              text,
    ADD COLUMN temporal_identity text;

CREATE FUNCTION connector_operator_audit_identity() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    NEW.db_role := current_user;
    NEW.db_session_user := session_user;
    NEW.db_client_addr := inet_client_addr();
    RETURN NEW;
END;
$fn$;

CREATE TRIGGER connector_operator_audit_identity_tg
    BEFORE INSERT ON connector_operator_audit
    FOR EACH ROW EXECUTE FUNCTION connector_operator_audit_identity();

-- -- S-7: the marker and the one check every erase makes --------------------------------

CREATE FUNCTION erased_value() RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $fn$ SELECT '"connector-push:erased"'::jsonb $fn$;

-- True when this UPDATE erases the row's values; false when it is not an erase.
-- Raises for an erase that is not allowed, or for undoing one.
CREATE FUNCTION erase_requested(tbl text, old_row jsonb, new_row jsonb, finished boolean)
RETURNS boolean LANGUAGE plpgsql AS $fn$
BEGIN
    IF old_row->>'values_erased_at' IS NOT NULL THEN
        IF new_row->'values_erased_at' IS DISTINCT FROM old_row->'values_erased_at' THEN
            PERFORM raise_evidence_guard(tbl, 'values are erased once, for good (S-7)');
        END IF;
        RETURN false;
    END IF;
    IF new_row->>'values_erased_at' IS NULL THEN
        RETURN false;
    END IF;
    IF NOT pg_has_role(current_user, 'connector_push_operator', 'MEMBER') THEN
        PERFORM raise_evidence_guard(tbl,
            'only the operator role erases values (connector-push forget, S-7)');
    END IF;
    IF (new_row - 'values_erased_at' - 'updated_at')
       IS DISTINCT FROM (old_row - 'values_erased_at' - 'updated_at') THEN
        PERFORM raise_evidence_guard(tbl, 'an erase changes nothing but the erased values');
    END IF;
    IF NOT finished THEN
        PERFORM raise_evidence_guard(tbl,
            'an unfinished row keeps its values (it may still be sent or processed)');
    END IF;
    RETURN true;
END;
$fn$;

CREATE FUNCTION erase_frozen_request(snapshot jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT snapshot || jsonb_build_object('body', erased_value())
        || CASE WHEN jsonb_typeof(snapshot->'locator_value') IN ('string', 'number')
                THEN jsonb_build_object('locator_value', erased_value())
                ELSE '{}'::jsonb END
$fn$;

CREATE FUNCTION erased_payload_hash(payload text) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$ SELECT encode(sha256(convert_to(payload, 'UTF8')), 'hex') $fn$;

-- -- attempts and PATCHes: the frozen body (and a create's locator value) -----------------

ALTER TABLE connector_push_attempt ADD COLUMN values_erased_at timestamptz;
ALTER TABLE connector_patch_dispatch ADD COLUMN values_erased_at timestamptz;

CREATE FUNCTION connector_push_attempt_erase_values() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF OLD.values_erased_at IS NOT NULL
       AND NEW.request_snapshot IS DISTINCT FROM OLD.request_snapshot THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'erased values stay erased (S-7)');
    END IF;
    IF erase_requested(TG_TABLE_NAME, to_jsonb(OLD), to_jsonb(NEW),
                       OLD.status IN ('finalized', 'superseded', 'terminal_failed')) THEN
        NEW.request_snapshot := erase_frozen_request(OLD.request_snapshot);
    END IF;
    RETURN NEW;
END;
$fn$;

CREATE FUNCTION connector_patch_dispatch_erase_values() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF OLD.values_erased_at IS NOT NULL AND NEW.body IS DISTINCT FROM OLD.body THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'erased values stay erased (S-7)');
    END IF;
    IF erase_requested(TG_TABLE_NAME, to_jsonb(OLD), to_jsonb(NEW),
                       OLD.status IN ('succeeded', 'failed', 'superseded'))
       AND OLD.body IS NOT NULL THEN
        NEW.body := erased_value();
    END IF;
    RETURN NEW;
END;
$fn$;

-- -- the inbox: webhook payloads and workflow-action payloads -----------------------------

ALTER TABLE connector_event
    ADD COLUMN values_erased_at timestamptz, ADD COLUMN erased_payload_sha256 text;
ALTER TABLE ingress_receipt
    ADD COLUMN values_erased_at timestamptz, ADD COLUMN erased_payload_sha256 text;
ALTER TABLE workflow_action_execution
    ADD COLUMN values_erased_at timestamptz, ADD COLUMN erased_payload_sha256 text;

CREATE FUNCTION inbox_erase_values() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    finished boolean;
BEGIN
    IF OLD.values_erased_at IS NOT NULL
       AND (NEW.payload, NEW.erased_payload_sha256)
           IS DISTINCT FROM (OLD.payload, OLD.erased_payload_sha256) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'erased values stay erased (S-7)');
    END IF;
    finished := CASE TG_TABLE_NAME
        WHEN 'connector_event' THEN to_jsonb(OLD)->>'status' <> 'admitted'
        WHEN 'workflow_action_execution' THEN to_jsonb(OLD)->>'phase' IN ('delivered', 'stopped')
        -- a receipt: as retention's rule (0041), its event finished and no live execution
        ELSE (OLD.payload IS NOT NULL
              AND (to_jsonb(OLD)->>'event_id' IS NULL
                   OR EXISTS (SELECT 1 FROM connector_event e
                              WHERE e.event_id = to_jsonb(OLD)->>'event_id'
                                AND e.status <> 'admitted'))
              AND NOT EXISTS (SELECT 1 FROM workflow_action_execution x
                              WHERE x.receipt_id = to_jsonb(OLD)->>'receipt_id'
                                AND x.phase NOT IN ('delivered', 'stopped')))
    END;
    IF erase_requested(TG_TABLE_NAME, to_jsonb(OLD), to_jsonb(NEW), finished) THEN
        NEW.erased_payload_sha256 := erased_payload_hash(OLD.payload);
        NEW.payload := erased_value()::text;
    END IF;
    RETURN NEW;
END;
$fn$;

-- 0041's receipt guard refuses every UPDATE; it now lets exactly a request to erase
-- through to the trigger below, which checks it like every other erase.
CREATE OR REPLACE FUNCTION ingress_receipt_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' AND OLD.values_erased_at IS NULL AND NEW.values_erased_at IS NOT NULL
    THEN
        RETURN NEW;  -- ingress_receipt_values_erased_tg decides (S-7)
    END IF;
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

-- Named `..._values_erased_tg` so each fires after its table's other BEFORE UPDATE
-- triggers (Postgres fires them in name order): those see the row the statement wrote.
CREATE TRIGGER connector_push_attempt_values_erased_tg
    BEFORE UPDATE ON connector_push_attempt
    FOR EACH ROW EXECUTE FUNCTION connector_push_attempt_erase_values();
CREATE TRIGGER connector_patch_dispatch_values_erased_tg
    BEFORE UPDATE ON connector_patch_dispatch
    FOR EACH ROW EXECUTE FUNCTION connector_patch_dispatch_erase_values();
CREATE TRIGGER connector_event_values_erased_tg
    BEFORE UPDATE ON connector_event
    FOR EACH ROW EXECUTE FUNCTION inbox_erase_values();
CREATE TRIGGER ingress_receipt_values_erased_tg
    BEFORE UPDATE ON ingress_receipt
    FOR EACH ROW EXECUTE FUNCTION inbox_erase_values();
CREATE TRIGGER workflow_action_execution_values_erased_tg
    BEFORE UPDATE ON workflow_action_execution
    FOR EACH ROW EXECUTE FUNCTION inbox_erase_values();

-- 0220 gave the roles their tables; objects made here go to the same owner.
ALTER FUNCTION connector_operator_audit_identity() OWNER TO connector_push_migrator;
ALTER FUNCTION erased_value() OWNER TO connector_push_migrator;
ALTER FUNCTION erase_requested(text, jsonb, jsonb, boolean) OWNER TO connector_push_migrator;
ALTER FUNCTION erase_frozen_request(jsonb) OWNER TO connector_push_migrator;
ALTER FUNCTION erased_payload_hash(text) OWNER TO connector_push_migrator;
ALTER FUNCTION connector_push_attempt_erase_values() OWNER TO connector_push_migrator;
ALTER FUNCTION connector_patch_dispatch_erase_values() OWNER TO connector_push_migrator;
ALTER FUNCTION inbox_erase_values() OWNER TO connector_push_migrator;
