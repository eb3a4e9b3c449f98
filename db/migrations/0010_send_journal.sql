-- Send journal and monotonic evidence (SPEC §14.1 JRN-1, JRN-2; §14.2 PROF-1, PROF-4).
--
-- Every try of a create or PATCH that passes its fence appends one row here, in
-- the same statement as its checkpoint compare-and-set (db/journal.py). A row's
-- outcome may be filled once; nothing else about it ever changes. Whether a row
-- proves "this try had no effect" is decided with the status sets of
-- protocol/recovery.py (tests/db/test_journal.py checks every status 100-599).
--
-- Once any try may have landed, Postgres refuses every write that would forget
-- it: clearing RemoteIOStartedAt, a terminal end without a definite rejection,
-- deleting the row, changing its identity or its frozen request.

CREATE TABLE connector_send_journal (
    journal_id           bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    attempt_id           uuid        REFERENCES connector_push_attempt (attempt_id),
    patch_id             uuid        REFERENCES connector_patch_dispatch (patch_id)
        ON DELETE CASCADE,
    claim_token          uuid        NOT NULL,
    method               text        NOT NULL,
    -- PROF-1, frozen with the request: answers that prove the try was not applied.
    not_applied_statuses integer[]   NOT NULL DEFAULT '{}',
    sending_at           timestamptz NOT NULL DEFAULT now(),
    outcome              text        CHECK (outcome IN ('not_sent', 'no_answer', 'answered')),
    status               integer     CHECK (status BETWEEN 100 AND 599),
    response_hash        text,
    retry_after_seconds  double precision CHECK (retry_after_seconds >= 0),
    outcome_at           timestamptz,
    CONSTRAINT connector_send_journal_owner_ck CHECK (num_nonnulls(attempt_id, patch_id) = 1),
    CONSTRAINT connector_send_journal_status_ck
        CHECK (CASE WHEN outcome = 'answered' THEN status IS NOT NULL ELSE status IS NULL END),
    CONSTRAINT connector_send_journal_outcome_at_ck
        CHECK ((outcome IS NULL) = (outcome_at IS NULL))
);

CREATE INDEX connector_send_journal_attempt_ix
    ON connector_send_journal (attempt_id, journal_id) WHERE attempt_id IS NOT NULL;
CREATE INDEX connector_send_journal_patch_ix
    ON connector_send_journal (patch_id, journal_id) WHERE patch_id IS NOT NULL;

-- The PATCH's frozen profile contract (PROF-1/PROF-2), written with its body.
ALTER TABLE connector_patch_dispatch ADD COLUMN profile_snapshot jsonb
    CHECK (profile_snapshot IS NULL OR jsonb_typeof(profile_snapshot) = 'object');

-- Rows checkpointed before the journal existed: one try each, outcome unknown.
INSERT INTO connector_send_journal (attempt_id, claim_token, method, sending_at)
SELECT attempt_id, COALESCE(claim_token, gen_random_uuid()), 'POST', remote_io_started_at
FROM connector_push_attempt WHERE remote_io_started_at IS NOT NULL;
INSERT INTO connector_send_journal (patch_id, claim_token, method, sending_at)
SELECT patch_id, COALESCE(claim_token, gen_random_uuid()), 'PATCH', remote_io_started_at
FROM connector_patch_dispatch WHERE remote_io_started_at IS NOT NULL;

-- -- what a try proves --------------------------------------------------------

-- A definite rejection (POST-4, PATCH-3): a 4xx other than "try again" (and, for a
-- create, other than 409, which may mean an earlier try created the object).
CREATE FUNCTION send_definitely_rejected(kind text, status integer) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT status BETWEEN 400 AND 499
       AND status <> ALL (CASE WHEN kind = 'create' THEN ARRAY[408, 409, 425, 429]
                               ELSE ARRAY[408, 425, 429] END)
$fn$;

CREATE FUNCTION send_try_may_have_landed(
    kind text, outcome text, status integer, not_applied integer[]
) RETURNS boolean
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE
        WHEN outcome = 'not_sent' THEN false
        WHEN outcome = 'answered' THEN
            NOT (status = ANY (not_applied) OR send_definitely_rejected(kind, status))
        ELSE true  -- in flight, or sent without an answer
    END
$fn$;

CREATE FUNCTION attempt_effect_possible(p_attempt uuid, p_checkpoint timestamptz)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (
        SELECT 1 FROM connector_send_journal j
        WHERE j.attempt_id = p_attempt
          AND send_try_may_have_landed('create', j.outcome, j.status, j.not_applied_statuses))
    -- checkpointed with no journal row at all: one try of unknown outcome
    OR (p_checkpoint IS NOT NULL
        AND NOT EXISTS (SELECT 1 FROM connector_send_journal j WHERE j.attempt_id = p_attempt))
$fn$;

CREATE FUNCTION patch_effect_possible(p_patch uuid) RETURNS boolean
LANGUAGE sql STABLE AS $fn$
    SELECT EXISTS (
        SELECT 1 FROM connector_send_journal j
        WHERE j.patch_id = p_patch
          AND send_try_may_have_landed('patch', j.outcome, j.status, j.not_applied_statuses))
$fn$;

-- The newest try of the row was answered with a definite rejection.
CREATE FUNCTION send_last_try_rejected(kind text, p_attempt uuid, p_patch uuid)
RETURNS boolean LANGUAGE sql STABLE AS $fn$
    SELECT COALESCE((
        SELECT j.outcome = 'answered' AND send_definitely_rejected(kind, j.status)
        FROM connector_send_journal j
        WHERE (p_attempt IS NOT NULL AND j.attempt_id = p_attempt)
           OR (p_patch IS NOT NULL AND j.patch_id = p_patch)
        ORDER BY j.journal_id DESC LIMIT 1), false)
$fn$;

CREATE FUNCTION raise_evidence_guard(tbl text, what text) RETURNS void
LANGUAGE plpgsql AS $fn$
BEGIN
    RAISE EXCEPTION '%: % (evidence of a possible remote effect only grows)', tbl, what
        USING ERRCODE = 'CP004', TABLE = tbl;
END;
$fn$;

-- -- the journal itself: append-only but for one outcome ----------------------

CREATE FUNCTION connector_send_journal_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'TRUNCATE is not allowed');
    ELSIF TG_OP = 'DELETE' THEN
        IF EXISTS (SELECT 1 FROM connector_push_attempt a WHERE a.attempt_id = OLD.attempt_id
                   AND a.status NOT IN ('finalized', 'superseded'))
           OR EXISTS (SELECT 1 FROM connector_patch_dispatch p WHERE p.patch_id = OLD.patch_id
                      AND p.status IN ('pending', 'processing')) THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME,
                'a journal row of an unfinished attempt or PATCH cannot be deleted');
        END IF;
        RETURN OLD;
    END IF;
    IF OLD.outcome IS NOT NULL THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'an outcome is recorded once');
    END IF;
    IF NEW.outcome IS NULL
       OR (NEW.journal_id, NEW.attempt_id, NEW.patch_id, NEW.claim_token, NEW.method,
           NEW.not_applied_statuses, NEW.sending_at)
          IS DISTINCT FROM
          (OLD.journal_id, OLD.attempt_id, OLD.patch_id, OLD.claim_token, OLD.method,
           OLD.not_applied_statuses, OLD.sending_at) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'only the outcome of a try may be written');
    END IF;
    RETURN NEW;
END;
$guard$;

CREATE TRIGGER connector_send_journal_guard_tg BEFORE UPDATE OR DELETE ON connector_send_journal
    FOR EACH ROW EXECUTE FUNCTION connector_send_journal_guard();
CREATE TRIGGER connector_send_journal_no_truncate_tg BEFORE TRUNCATE ON connector_send_journal
    FOR EACH STATEMENT EXECUTE FUNCTION connector_send_journal_guard();

-- -- attempts ------------------------------------------------------------------

CREATE FUNCTION connector_push_attempt_evidence_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            TG_OP || ' is not allowed; supersede or retire instead');
    END IF;
    IF (NEW.attempt_id, NEW.link_key, NEW.connector_owner_key, NEW.action_slot_id,
        NEW.action_type, NEW.source_object, NEW.source_record_id, NEW.destination_slot_id,
        NEW.attempt_ordinal, NEW.request_idempotency_key, NEW.created_at)
       IS DISTINCT FROM
       (OLD.attempt_id, OLD.link_key, OLD.connector_owner_key, OLD.action_slot_id,
        OLD.action_type, OLD.source_object, OLD.source_record_id, OLD.destination_slot_id,
        OLD.attempt_ordinal, OLD.request_idempotency_key, OLD.created_at) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'identity columns are immutable');
    END IF;
    IF OLD.remote_io_started_at IS NOT NULL THEN
        IF NEW.remote_io_started_at IS NULL THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME, 'remote_io_started_at cannot be cleared');
        END IF;
        IF NEW.request_snapshot IS DISTINCT FROM OLD.request_snapshot THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME,
                'the frozen request cannot change once a try passed its fence');
        END IF;
        IF NEW.status = 'pending' AND OLD.status <> 'pending' THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME,
                'a checkpointed attempt cannot return to pending');
        END IF;
    END IF;
    IF NEW.status = 'terminal_failed' AND OLD.status <> 'terminal_failed'
       AND attempt_effect_possible(NEW.attempt_id, NEW.remote_io_started_at)
       AND NOT send_last_try_rejected('create', NEW.attempt_id, NULL) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            'an attempt whose create may have landed cannot end terminal_failed '
            || 'without a definite rejection of its last try');
    END IF;
    RETURN NEW;
END;
$guard$;

CREATE TRIGGER connector_push_attempt_evidence_tg
    BEFORE UPDATE OR DELETE ON connector_push_attempt
    FOR EACH ROW EXECUTE FUNCTION connector_push_attempt_evidence_guard();
CREATE TRIGGER connector_push_attempt_no_truncate_tg BEFORE TRUNCATE ON connector_push_attempt
    FOR EACH STATEMENT EXECUTE FUNCTION connector_push_attempt_evidence_guard();

-- -- PATCH dispatches ----------------------------------------------------------

CREATE FUNCTION connector_patch_dispatch_evidence_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'TRUNCATE' THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'TRUNCATE is not allowed');
    ELSIF TG_OP = 'DELETE' THEN
        IF OLD.status IN ('pending', 'processing') THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME, 'an unfinished PATCH cannot be deleted');
        END IF;
        RETURN OLD;
    END IF;
    IF (NEW.patch_id, NEW.link_key, NEW.created_at)
       IS DISTINCT FROM (OLD.patch_id, OLD.link_key, OLD.created_at) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'identity columns are immutable');
    END IF;
    IF OLD.remote_io_started_at IS NOT NULL THEN
        IF NEW.remote_io_started_at IS NULL THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME, 'remote_io_started_at cannot be cleared');
        END IF;
        IF (NEW.body, NEW.update_path) IS DISTINCT FROM (OLD.body, OLD.update_path) THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME,
                'the frozen PATCH cannot change once a try passed its fence');
        END IF;
        IF NEW.status = 'pending' AND OLD.status <> 'pending' THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME,
                'a checkpointed PATCH cannot return to pending');
        END IF;
    END IF;
    IF NEW.status = 'failed' AND OLD.status <> 'failed'
       AND patch_effect_possible(NEW.patch_id)
       AND NOT send_last_try_rejected('patch', NULL, NEW.patch_id) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            'a PATCH that may have landed cannot end failed without a definite response');
    END IF;
    RETURN NEW;
END;
$guard$;

CREATE TRIGGER connector_patch_dispatch_evidence_tg
    BEFORE UPDATE OR DELETE ON connector_patch_dispatch
    FOR EACH ROW EXECUTE FUNCTION connector_patch_dispatch_evidence_guard();
CREATE TRIGGER connector_patch_dispatch_no_truncate_tg BEFORE TRUNCATE ON connector_patch_dispatch
    FOR EACH STATEMENT EXECUTE FUNCTION connector_patch_dispatch_evidence_guard();

-- -- links -----------------------------------------------------------------------

CREATE FUNCTION connector_remote_link_evidence_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, TG_OP || ' is not allowed; retire instead');
    END IF;
    IF (NEW.link_key, NEW.connector_owner_key, NEW.action_slot_id, NEW.action_type,
        NEW.source_object, NEW.source_record_id, NEW.destination_slot_id, NEW.remote_id,
        NEW.remote_scope, NEW.created_pack_install_id, NEW.created_at)
       IS DISTINCT FROM
       (OLD.link_key, OLD.connector_owner_key, OLD.action_slot_id, OLD.action_type,
        OLD.source_object, OLD.source_record_id, OLD.destination_slot_id, OLD.remote_id,
        OLD.remote_scope, OLD.created_pack_install_id, OLD.created_at) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'identity columns are immutable');
    END IF;
    RETURN NEW;
END;
$guard$;

CREATE TRIGGER connector_remote_link_evidence_tg
    BEFORE UPDATE OR DELETE ON connector_remote_link
    FOR EACH ROW EXECUTE FUNCTION connector_remote_link_evidence_guard();
CREATE TRIGGER connector_remote_link_no_truncate_tg BEFORE TRUNCATE ON connector_remote_link
    FOR EACH STATEMENT EXECUTE FUNCTION connector_remote_link_evidence_guard();

-- -- PROF-4: canonical remote ids ----------------------------------------------------
-- No surrounding whitespace, no control characters (protocol/remote_ids.py is
-- stricter and names the problem; this is the line no code path can cross).

ALTER TABLE connector_remote_link ADD CONSTRAINT connector_remote_link_remote_id_canonical_ck
    CHECK (remote_id ~ '^[^[:space:][:cntrl:]]([^[:cntrl:]]*[^[:space:][:cntrl:]])?$');
ALTER TABLE connector_push_attempt ADD CONSTRAINT connector_push_attempt_remote_id_canonical_ck
    CHECK (remote_id IS NULL
           OR remote_id ~ '^[^[:space:][:cntrl:]]([^[:cntrl:]]*[^[:space:][:cntrl:]])?$');
