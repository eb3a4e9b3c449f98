-- One journal row per request (SPEC §17 G-1): a GET gets a row of its own, so evidence of
-- every request a link's workflow sent exists. `kind` says which request a row is:
--   send      a create POST or a PATCH that passed its fence (JRN-1, as before);
--   lookup    the GET of a create's unique locator (owned by its attempt);
--   readback  the GET of a PATCHed object (owned by its PATCH).
-- A GET changes nothing at the remote, so only `send` rows count as a try that may have
-- landed: the effect functions below, and every reader of the journal that decides
-- (db/journal.py), read `send` rows only. A row's kind, like its identity, never changes.

ALTER TABLE connector_send_journal
    ADD COLUMN kind text NOT NULL DEFAULT 'send'
        CONSTRAINT connector_send_journal_kind_ck CHECK (kind IN ('send', 'lookup', 'readback')),
    ADD CONSTRAINT connector_send_journal_kind_owner_ck CHECK (
        CASE kind
            WHEN 'lookup' THEN attempt_id IS NOT NULL AND method = 'GET'
            WHEN 'readback' THEN patch_id IS NOT NULL AND method = 'GET'
            ELSE method <> 'GET'
        END);

CREATE OR REPLACE FUNCTION attempt_effect_possible(p_attempt uuid, p_checkpoint timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (
        SELECT 1 FROM connector_send_journal j
        WHERE j.attempt_id = p_attempt AND j.kind = 'send'
          AND send_try_may_have_landed('create', j.outcome, j.status, j.not_applied_statuses))
    -- checkpointed with no send row at all: one try of unknown outcome
    OR (p_checkpoint IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM connector_send_journal j
                        WHERE j.attempt_id = p_attempt AND j.kind = 'send'))
$fn$;

CREATE OR REPLACE FUNCTION patch_effect_possible(p_patch uuid) RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (
        SELECT 1 FROM connector_send_journal j
        WHERE j.patch_id = p_patch AND j.kind = 'send'
          AND send_try_may_have_landed('patch', j.outcome, j.status, j.not_applied_statuses))
$fn$;

-- 0010's guard, with `kind` among what never changes.
CREATE OR REPLACE FUNCTION connector_send_journal_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'TRUNCATE is not allowed');
    ELSIF TG_OP = 'DELETE' THEN
        RETURN OLD;  -- connector_send_journal_delete_guard (0170) decides deletes
    END IF;
    IF OLD.outcome IS NOT NULL THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'an outcome is recorded once');
    END IF;
    IF NEW.outcome IS NULL
       OR (NEW.journal_id, NEW.attempt_id, NEW.patch_id, NEW.claim_token, NEW.method,
           NEW.not_applied_statuses, NEW.sending_at, NEW.kind)
          IS DISTINCT FROM
          (OLD.journal_id, OLD.attempt_id, OLD.patch_id, OLD.claim_token, OLD.method,
           OLD.not_applied_statuses, OLD.sending_at, OLD.kind) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'only the outcome of a try may be written');
    END IF;
    RETURN NEW;
END;
$guard$;
