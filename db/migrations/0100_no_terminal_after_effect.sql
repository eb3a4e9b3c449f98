-- No terminal end after a possible effect (SPEC §15 C-1, C-2; seed 000 "Create Attempt
-- State", "After POST", "Before PATCH"; overrides the definite-rejection clause of JRN-2).
--
-- 0010 let an effect-possible attempt end terminal_failed (and a PATCH end failed) when
-- its *last* try was definitely rejected. A 409/422 answering a same-key re-send may be
-- the remote saying "that object exists": the earlier try created it. So:
--   * terminal_failed is refused whenever attempt_effect_possible(...), whatever the last
--     try answered: such an attempt parks ambiguous_remote_effect (protocol/recovery.py
--     `on_definite_rejection`, `next_step`);
--   * superseded is refused likewise: supersede reserves a new attempt that would POST a
--     second object; only reconcile (or backfill/migration policy) resolves it;
--   * a PATCH is never re-sent once a try may have landed (C-2), so a definite answer
--     after a possible effect can only come from a re-send that should not have happened:
--     failed is refused whenever patch_effect_possible(...), with no last-try exception.
-- Attempts left terminal_failed by 0010's exception are moved to ambiguous_remote_effect
-- (where reconcile applies), so no row contradicts the rule.

CREATE OR REPLACE FUNCTION connector_push_attempt_evidence_guard() RETURNS trigger
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
       AND attempt_effect_possible(NEW.attempt_id, NEW.remote_io_started_at) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            'an attempt whose create may have landed cannot end terminal_failed, whatever '
            || 'a later try answered; it parks ambiguous_remote_effect (reconcile it)');
    END IF;
    IF NEW.status = 'superseded' AND OLD.status <> 'superseded'
       AND attempt_effect_possible(NEW.attempt_id, NEW.remote_io_started_at) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            'an attempt whose create may have landed cannot be superseded '
            || '(a new attempt could create a second object); reconcile it');
    END IF;
    RETURN NEW;
END;
$guard$;

CREATE OR REPLACE FUNCTION connector_patch_dispatch_evidence_guard() RETURNS trigger
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
       AND patch_effect_possible(NEW.patch_id) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            'a PATCH that may have landed cannot end failed; it is ambiguous_remote_effect');
    END IF;
    RETURN NEW;
END;
$guard$;

-- 0010's last-try exception is gone; nothing reads this any more.
DROP FUNCTION send_last_try_rejected(text, uuid, uuid);

-- Rows that 0010's exception let end terminal: ambiguous, as they always were. The move
-- terminal_failed -> ambiguous_remote_effect is no transition the runtime may make, so
-- the status trigger is bypassed for this one statement of the migration.
ALTER TABLE connector_push_attempt DISABLE TRIGGER connector_push_attempt_status_update_tg;
UPDATE connector_push_attempt
SET status = 'ambiguous_remote_effect',
    last_error = 'a try may have landed (C-1, migration 0100); was: '
                 || COALESCE(last_error, 'terminal_failed')
WHERE status = 'terminal_failed'
  AND attempt_effect_possible(attempt_id, remote_io_started_at);
ALTER TABLE connector_push_attempt ENABLE TRIGGER connector_push_attempt_status_update_tg;
