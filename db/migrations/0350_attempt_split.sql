-- The attempt row, split (STO-2; bench P9): what admission freezes is written once, the
-- state a create moves is a narrow row.
--
-- A create writes its attempt four times (reserved, claimed, sent, finalized), and each
-- write copied the whole ~3.3 kB row: the frozen request (its profile snapshot inside),
-- the action and authority snapshots, the slot's names. Now:
--   * connector_push_attempt keeps its name, its identity (link key, owner, slot,
--     record, ordinal, lane, the LANE-3 vector), the state the protocol moves (status,
--     claim, checkpoint, answer, remote id, mirror, retries, errors, operator stamps)
--     and every guard on them (ARCH-3 status triggers, ID-5, G-2's record lock, G-3);
--   * connector_push_attempt_request holds the rest, one row per attempt, inserted with
--     it and updated only by LANE-2's completed body (under the claim, before the fence)
--     and S-7's erase;
--   * the profile snapshot (inside the request) and the action snapshot, the same for
--     every create of a slot, are stored once per content in connector_frozen_snapshot,
--     keyed by the SHA-256 of their jsonb text, and named by digest from the request row;
--   * connector_push_attempt_frozen (a view, read only: every write names the tables)
--     gives the frozen request back whole, profile and action snapshots in place.
-- No foreign key names a snapshot: checking one would lock the shared row (a WAL record
-- and a MultiXact per create); snapshots are never updated or deleted (trigger below).

CREATE TABLE connector_frozen_snapshot (
    digest   bytea PRIMARY KEY CHECK (octet_length(digest) = 32),
    snapshot jsonb NOT NULL CHECK (jsonb_typeof(snapshot) = 'object')
);

-- The key of a snapshot: the SHA-256 of its jsonb text (jsonb prints one text per value).
CREATE FUNCTION connector_snapshot_digest(snapshot jsonb) RETURNS bytea
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $fn$
    SELECT CASE WHEN jsonb_typeof(snapshot) = 'object'
                THEN sha256(convert_to(snapshot::text, 'UTF8')) END
$fn$;

CREATE TRIGGER connector_frozen_snapshot_append_only_tg
    BEFORE UPDATE OR DELETE ON connector_frozen_snapshot
    FOR EACH ROW EXECUTE FUNCTION reject_append_only_write();
CREATE TRIGGER connector_frozen_snapshot_no_truncate_tg
    BEFORE TRUNCATE ON connector_frozen_snapshot
    FOR EACH STATEMENT EXECUTE FUNCTION reject_append_only_write();

CREATE TABLE connector_push_attempt_request (
    attempt_id              uuid        PRIMARY KEY
        REFERENCES connector_push_attempt (attempt_id),
    action_type             text        NOT NULL,
    connector_namespace     text        NOT NULL,
    flow_developer_name     text        NOT NULL,
    flow_action_name        text        NOT NULL,
    flow_version            text,
    target_object           text        NOT NULL,
    profile_name            text        NOT NULL,
    pack_install_id         uuid        NOT NULL REFERENCES pack_install (pack_install_id),
    request_idempotency_key text        NOT NULL CHECK (request_idempotency_key <> ''),
    -- the frozen request without its profile, which profile_digest names
    request_snapshot        jsonb       NOT NULL CHECK (jsonb_typeof(request_snapshot) = 'object'),
    profile_digest          bytea,
    action_digest           bytea,
    authority_snapshot      jsonb       NOT NULL
        CHECK (jsonb_typeof(authority_snapshot) = 'object'),
    writeback_snapshot      jsonb,
    values_erased_at        timestamptz
);

-- Existing attempts: their snapshots, then their requests.
INSERT INTO connector_frozen_snapshot (digest, snapshot)
SELECT DISTINCT connector_snapshot_digest(s.snapshot), s.snapshot
FROM connector_push_attempt a,
     LATERAL (VALUES (a.request_snapshot -> 'profile'), (a.action_snapshot)) AS s (snapshot)
WHERE jsonb_typeof(s.snapshot) = 'object'
ON CONFLICT DO NOTHING;

INSERT INTO connector_push_attempt_request (
    attempt_id, action_type, connector_namespace, flow_developer_name, flow_action_name,
    flow_version, target_object, profile_name, pack_install_id, request_idempotency_key,
    request_snapshot, profile_digest, action_digest, authority_snapshot, writeback_snapshot,
    values_erased_at)
SELECT attempt_id, action_type, connector_namespace, flow_developer_name, flow_action_name,
       flow_version, target_object, profile_name, pack_install_id, request_idempotency_key,
       CASE WHEN jsonb_typeof(request_snapshot -> 'profile') = 'object'
            THEN request_snapshot - 'profile' ELSE request_snapshot END,
       connector_snapshot_digest(request_snapshot -> 'profile'),
       connector_snapshot_digest(action_snapshot), authority_snapshot, writeback_snapshot,
       values_erased_at
FROM connector_push_attempt;

-- The request, whole again (read only).
CREATE VIEW connector_push_attempt_frozen AS
SELECT r.attempt_id, r.action_type, r.connector_namespace, r.flow_developer_name,
       r.flow_action_name, r.flow_version, r.target_object, r.profile_name, r.pack_install_id,
       r.request_idempotency_key,
       CASE WHEN p.snapshot IS NULL THEN r.request_snapshot
            ELSE r.request_snapshot || jsonb_build_object('profile', p.snapshot) END
           AS request_snapshot,
       x.snapshot AS action_snapshot, r.authority_snapshot, r.writeback_snapshot,
       r.values_erased_at
FROM connector_push_attempt_request r
LEFT JOIN connector_frozen_snapshot p ON p.digest = r.profile_digest
LEFT JOIN connector_frozen_snapshot x ON x.digest = r.action_digest;

-- -- the state row loses what moved --------------------------------------------------------

DROP TRIGGER connector_push_attempt_values_erased_tg ON connector_push_attempt;
DROP FUNCTION connector_push_attempt_erase_values();

-- 0100's guard without the columns that left: the request's own guard is below.
CREATE OR REPLACE FUNCTION connector_push_attempt_evidence_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP IN ('DELETE', 'TRUNCATE') THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            TG_OP || ' is not allowed; supersede or retire instead');
    END IF;
    IF (NEW.attempt_id, NEW.link_key, NEW.connector_owner_key, NEW.action_slot_id,
        NEW.source_object, NEW.source_record_id, NEW.destination_slot_id,
        NEW.attempt_ordinal, NEW.created_at)
       IS DISTINCT FROM
       (OLD.attempt_id, OLD.link_key, OLD.connector_owner_key, OLD.action_slot_id,
        OLD.source_object, OLD.source_record_id, OLD.destination_slot_id,
        OLD.attempt_ordinal, OLD.created_at) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'identity columns are immutable');
    END IF;
    IF OLD.remote_io_started_at IS NOT NULL THEN
        IF NEW.remote_io_started_at IS NULL THEN
            PERFORM raise_evidence_guard(TG_TABLE_NAME, 'remote_io_started_at cannot be cleared');
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

ALTER TABLE connector_push_attempt
    DROP COLUMN action_type,
    DROP COLUMN connector_namespace,
    DROP COLUMN flow_developer_name,
    DROP COLUMN flow_action_name,
    DROP COLUMN flow_version,
    DROP COLUMN target_object,
    DROP COLUMN profile_name,
    DROP COLUMN pack_install_id,
    DROP COLUMN request_idempotency_key,  -- and connector_push_attempt_idempotency_key_uq
    DROP COLUMN request_snapshot,
    DROP COLUMN action_snapshot,
    DROP COLUMN authority_snapshot,
    DROP COLUMN writeback_snapshot,
    DROP COLUMN values_erased_at;

CREATE UNIQUE INDEX connector_push_attempt_request_idempotency_key_uq
    ON connector_push_attempt_request (request_idempotency_key);

-- -- the request's guards: G-3, REC-1's fence, S-7 -------------------------------------------

-- Its identity never changes; its frozen request (and the snapshots it names) only before
-- the attempt's first try passed its fence (LANE-2 completes a deferred body under the
-- claim) or by S-7's erase, which the trigger after this one checks.
CREATE FUNCTION connector_push_attempt_request_guard() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'DELETE' THEN
        PERFORM raise_g3_delete_refused(TG_TABLE_NAME, 'the request of attempt ' || OLD.attempt_id,
            (SELECT a.status FROM connector_push_attempt a WHERE a.attempt_id = OLD.attempt_id),
            'an attempt is never deleted; supersede or retire instead');
    END IF;
    IF (NEW.attempt_id, NEW.action_type, NEW.request_idempotency_key)
       IS DISTINCT FROM (OLD.attempt_id, OLD.action_type, OLD.request_idempotency_key) THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'identity columns are immutable');
    END IF;
    IF (NEW.request_snapshot, NEW.profile_digest, NEW.action_digest)
       IS DISTINCT FROM (OLD.request_snapshot, OLD.profile_digest, OLD.action_digest)
       AND EXISTS (SELECT 1 FROM connector_push_attempt a
                   WHERE a.attempt_id = OLD.attempt_id AND a.remote_io_started_at IS NOT NULL)
    THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME,
            'the frozen request cannot change once a try passed its fence');
    END IF;
    RETURN NEW;
END;
$guard$;

-- 0225's erase, on the row that now holds the values; an attempt is finished when its
-- state row says so.
CREATE FUNCTION connector_push_attempt_request_erase_values() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF OLD.values_erased_at IS NOT NULL
       AND NEW.request_snapshot IS DISTINCT FROM OLD.request_snapshot THEN
        PERFORM raise_evidence_guard(TG_TABLE_NAME, 'erased values stay erased (S-7)');
    END IF;
    IF erase_requested(TG_TABLE_NAME, to_jsonb(OLD), to_jsonb(NEW),
                       EXISTS (SELECT 1 FROM connector_push_attempt a
                               WHERE a.attempt_id = OLD.attempt_id
                                 AND a.status IN ('finalized', 'superseded', 'terminal_failed')))
    THEN
        NEW.request_snapshot := erase_frozen_request(OLD.request_snapshot);
    END IF;
    RETURN NEW;
END;
$fn$;

CREATE TRIGGER connector_push_attempt_request_delete_guard_tg
    BEFORE DELETE ON connector_push_attempt_request
    FOR EACH ROW EXECUTE FUNCTION connector_push_attempt_request_guard();
CREATE TRIGGER connector_push_attempt_request_evidence_tg
    BEFORE UPDATE ON connector_push_attempt_request
    FOR EACH ROW EXECUTE FUNCTION connector_push_attempt_request_guard();
CREATE TRIGGER connector_push_attempt_request_no_truncate_tg
    BEFORE TRUNCATE ON connector_push_attempt_request
    FOR EACH STATEMENT EXECUTE FUNCTION connector_push_attempt_evidence_guard();
-- `..._values_erased_tg` fires after the guard (name order), as on the other tables.
CREATE TRIGGER connector_push_attempt_request_values_erased_tg
    BEFORE UPDATE ON connector_push_attempt_request
    FOR EACH ROW
    WHEN (OLD.values_erased_at IS NOT NULL OR NEW.values_erased_at IS NOT NULL)
    EXECUTE FUNCTION connector_push_attempt_request_erase_values();

-- -- S-4: owners and grants, as 0220 gives the attempt ---------------------------------------

ALTER TABLE connector_frozen_snapshot OWNER TO connector_push_migrator;
ALTER TABLE connector_push_attempt_request OWNER TO connector_push_migrator;
ALTER VIEW connector_push_attempt_frozen OWNER TO connector_push_migrator;
ALTER FUNCTION connector_snapshot_digest(jsonb) OWNER TO connector_push_migrator;
ALTER FUNCTION connector_push_attempt_request_guard() OWNER TO connector_push_migrator;
ALTER FUNCTION connector_push_attempt_request_erase_values() OWNER TO connector_push_migrator;
REVOKE ALL ON connector_frozen_snapshot, connector_push_attempt_request,
    connector_push_attempt_frozen FROM PUBLIC;
GRANT SELECT, INSERT, UPDATE ON connector_push_attempt_request
    TO connector_push_worker, connector_push_operator, connector_push_save_api;
-- Admission stores snapshots; nobody changes one (many requests name it).
GRANT SELECT, INSERT ON connector_frozen_snapshot
    TO connector_push_worker, connector_push_operator, connector_push_save_api;
GRANT SELECT ON connector_push_attempt_frozen
    TO connector_push_worker, connector_push_operator, connector_push_save_api;
