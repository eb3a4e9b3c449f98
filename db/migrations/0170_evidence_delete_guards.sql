-- G-3 (evidence that matters cannot be deleted; JRN-2, OPS-3). Postgres refuses to delete:
--   * any attempt row, in every status (supersede or retire instead);
--   * any PATCH row not in succeeded, failed or superseded (ambiguous_remote_effect,
--     pending and processing included);
--   * any send-journal row of such a PATCH, or of an attempt not finalized or superseded;
-- directly or by cascade. 0010 refused only pending/processing PATCHes, and its journal
-- guard let a cascade through because the PATCH it looked up was already gone.
--
-- The rule has one home: one BEFORE DELETE trigger per table, below. 0010's row triggers
-- keep UPDATE (and their TRUNCATE triggers stay as they are); their DELETE branches are
-- no longer reached. The settled PATCH statuses are `db.retention.SETTLED_PATCH_STATUSES`
-- and the released attempt statuses `protocol.states.ATTEMPT_RELEASED`;
-- tests/db/test_evidence_delete_guards.py drives every status and checks both.
--
-- A cascade: deleting a PATCH fires its BEFORE DELETE trigger while the row is still
-- there, so an unsettled PATCH is refused before its journal is touched. The cascade to
-- the journal runs after the PATCH is gone; a journal row whose PATCH is gone can only be
-- that cascade (the foreign key holds otherwise), from a PATCH its own guard let go.
-- Settled statuses never leave the settled set, so a status read here cannot go stale.

CREATE FUNCTION raise_g3_delete_refused(tbl text, what text, status text, rule text)
RETURNS void LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION '%: G-3 refuses to delete % (status %): %', tbl, what, status, rule
        USING ERRCODE = 'CP004', TABLE = tbl,
              DETAIL = json_build_object('rule', 'G-3', 'row', what, 'status', status)::text,
              HINT = 'evidence of a possible remote effect is kept; retention (connector-push '
                     'prune) skips it';
END;
$fn$;

-- -- attempts: never -------------------------------------------------------------------

CREATE FUNCTION connector_push_attempt_delete_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    PERFORM raise_g3_delete_refused(TG_TABLE_NAME, 'attempt ' || OLD.attempt_id, OLD.status,
        'an attempt is never deleted; supersede or retire instead');
    RETURN NULL;
END;
$guard$;

-- -- PATCHes: only settled ones ----------------------------------------------------------

CREATE FUNCTION connector_patch_dispatch_delete_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF OLD.status NOT IN ('succeeded', 'failed', 'superseded') THEN
        PERFORM raise_g3_delete_refused(TG_TABLE_NAME, 'PATCH ' || OLD.patch_id, OLD.status,
            'only a succeeded, failed or superseded PATCH may be deleted, '
            || 'with its send journal');
    END IF;
    RETURN OLD;
END;
$guard$;

-- -- the send journal: only of a settled PATCH or a released attempt -----------------------

CREATE FUNCTION connector_send_journal_delete_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
DECLARE
    owner_status text;
BEGIN
    IF OLD.attempt_id IS NOT NULL THEN
        SELECT a.status INTO owner_status
        FROM connector_push_attempt a WHERE a.attempt_id = OLD.attempt_id;
        -- attempts are never deleted: a missing one is no cascade, so refuse
        IF owner_status IS NULL OR owner_status NOT IN ('finalized', 'superseded') THEN
            PERFORM raise_g3_delete_refused(TG_TABLE_NAME,
                'journal row ' || OLD.journal_id || ' of attempt ' || OLD.attempt_id,
                COALESCE(owner_status, 'missing'),
                'only the journal of a finalized or superseded attempt may be deleted');
        END IF;
        RETURN OLD;
    END IF;
    SELECT p.status INTO owner_status
    FROM connector_patch_dispatch p WHERE p.patch_id = OLD.patch_id;
    -- NOT FOUND: the cascade of a PATCH whose own guard allowed its delete (header)
    IF FOUND AND owner_status NOT IN ('succeeded', 'failed', 'superseded') THEN
        PERFORM raise_g3_delete_refused(TG_TABLE_NAME,
            'journal row ' || OLD.journal_id || ' of PATCH ' || OLD.patch_id, owner_status,
            'only the journal of a succeeded, failed or superseded PATCH may be deleted');
    END IF;
    RETURN OLD;
END;
$guard$;

-- Named to fire before any other row trigger of its table on DELETE (name order).
CREATE TRIGGER connector_push_attempt_delete_guard_tg
    BEFORE DELETE ON connector_push_attempt
    FOR EACH ROW EXECUTE FUNCTION connector_push_attempt_delete_guard();
CREATE TRIGGER connector_patch_dispatch_delete_guard_tg
    BEFORE DELETE ON connector_patch_dispatch
    FOR EACH ROW EXECUTE FUNCTION connector_patch_dispatch_delete_guard();
CREATE TRIGGER connector_send_journal_delete_guard_tg
    BEFORE DELETE ON connector_send_journal
    FOR EACH ROW EXECUTE FUNCTION connector_send_journal_delete_guard();

-- 0010's row triggers: UPDATE only from here on (same names, same functions).
DROP TRIGGER connector_push_attempt_evidence_tg ON connector_push_attempt;
CREATE TRIGGER connector_push_attempt_evidence_tg
    BEFORE UPDATE ON connector_push_attempt
    FOR EACH ROW EXECUTE FUNCTION connector_push_attempt_evidence_guard();
DROP TRIGGER connector_patch_dispatch_evidence_tg ON connector_patch_dispatch;
CREATE TRIGGER connector_patch_dispatch_evidence_tg
    BEFORE UPDATE ON connector_patch_dispatch
    FOR EACH ROW EXECUTE FUNCTION connector_patch_dispatch_evidence_guard();
DROP TRIGGER connector_send_journal_guard_tg ON connector_send_journal;
CREATE TRIGGER connector_send_journal_guard_tg
    BEFORE UPDATE ON connector_send_journal
    FOR EACH ROW EXECUTE FUNCTION connector_send_journal_guard();
