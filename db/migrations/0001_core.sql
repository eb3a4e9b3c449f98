-- connector-push core schema (SPEC §3): packs, local record store, links,
-- create attempts, patch dispatches, revalidation receipts, and the database
-- guards of ARCH-3 / ID-4 / ID-5 / STO-4. The inbox tables live in 0002.
-- Status CHECKs, status triggers and the partial unique indexes that name
-- status values are generated from protocol/states.py (block at the end).

-- Housekeeping shared by the mutable tables: bump updated_at on every write,
-- and row_version where a table has one (compare-and-set readers rely on it).
CREATE FUNCTION touch_row() RETURNS trigger
LANGUAGE plpgsql AS $touch$
BEGIN
    NEW.updated_at := now();
    RETURN NEW;
END;
$touch$;

CREATE FUNCTION touch_versioned_row() RETURNS trigger
LANGUAGE plpgsql AS $touch$
BEGIN
    NEW.updated_at := now();
    NEW.row_version := OLD.row_version + 1;
    RETURN NEW;
END;
$touch$;

-- STO-4: append-only tables reject UPDATE, DELETE and TRUNCATE.
CREATE FUNCTION reject_append_only_write() RETURNS trigger
LANGUAGE plpgsql AS $reject$
BEGIN
    RAISE EXCEPTION '%: % is not allowed; the table is append-only', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'CP003', TABLE = TG_TABLE_NAME;
END;
$reject$;

-- ---------------------------------------------------------------------------
-- Packs (PACK-1). The manifest is kept whole; lineage is normalised because
-- the create gate queries it (ID-6).

CREATE TABLE pack_install (
    pack_install_id     uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    connector_owner_key text        NOT NULL,
    connector_namespace text        NOT NULL,
    manifest            jsonb       NOT NULL CHECK (jsonb_typeof(manifest) = 'object'),
    manifest_digest     text        NOT NULL,
    active              boolean     NOT NULL DEFAULT false,
    created_at          timestamptz NOT NULL DEFAULT now(),
    activated_at        timestamptz,
    deactivated_at      timestamptz
);

CREATE UNIQUE INDEX pack_install_one_active_uq
    ON pack_install (connector_owner_key) WHERE active;

CREATE TABLE pack_slot_lineage (
    pack_install_id uuid NOT NULL REFERENCES pack_install (pack_install_id),
    slot_type       text NOT NULL CHECK (slot_type IN ('action', 'destination')),
    from_slot       text NOT NULL,
    kind            text NOT NULL CHECK (kind IN ('rebind', 'retire')),
    to_slot         text,
    PRIMARY KEY (pack_install_id, slot_type, from_slot),
    CONSTRAINT pack_slot_lineage_target_ck CHECK ((kind = 'rebind') = (to_slot IS NOT NULL))
);

CREATE INDEX pack_slot_lineage_to_slot_ix ON pack_slot_lineage (slot_type, to_slot);

-- ---------------------------------------------------------------------------
-- Local record store (PACK-3): stands in for the CRM's record API.

CREATE TABLE crm_record (
    source_object text        NOT NULL,
    record_id     text        NOT NULL,
    fields        jsonb       NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(fields) = 'object'),
    version       bigint      NOT NULL DEFAULT 1,
    deleted       boolean     NOT NULL DEFAULT false,
    updated_at    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (source_object, record_id)
);

CREATE TABLE crm_object_permission (
    user_id       text    NOT NULL,
    source_object text    NOT NULL,
    can_read      boolean NOT NULL,
    PRIMARY KEY (user_id, source_object)
);

CREATE TABLE crm_record_permission (
    user_id       text    NOT NULL,
    source_object text    NOT NULL,
    record_id     text    NOT NULL,
    can_read      boolean NOT NULL,
    PRIMARY KEY (user_id, source_object, record_id)
);

CREATE TABLE crm_field_permission (
    user_id       text    NOT NULL,
    source_object text    NOT NULL,
    field_name    text    NOT NULL,
    can_read      boolean NOT NULL,
    PRIMARY KEY (user_id, source_object, field_name)
);

-- ---------------------------------------------------------------------------
-- Remote links (STO-1). Exists only once a remote id is known: there is no
-- pending link, a pending create is an attempt.

CREATE TABLE connector_remote_link (
    link_key                               text        PRIMARY KEY
        CHECK (link_key ~ '^lk[0-9]+_[0-9a-f]{64}$'),
    -- stable slot identity (ID-1, ID-2)
    connector_owner_key                    text        NOT NULL,
    action_slot_id                         text        NOT NULL,
    action_type                            text        NOT NULL,
    source_object                          text        NOT NULL,
    source_record_id                       text        NOT NULL,
    destination_slot_id                    text        NOT NULL,
    -- human-readable snapshots, never lookup keys
    connector_namespace                    text        NOT NULL,
    flow_developer_name                    text        NOT NULL,
    flow_action_name                       text        NOT NULL,
    flow_version                           text,
    target_object                          text        NOT NULL,
    profile_name                           text        NOT NULL,
    -- install lineage (ID-3)
    created_pack_install_id                uuid        NOT NULL
        REFERENCES pack_install (pack_install_id),
    last_validated_pack_install_id         uuid        NOT NULL
        REFERENCES pack_install (pack_install_id),
    -- profile snapshot (STO-3: references and hashes only, never secrets)
    credential_ref                         text        NOT NULL,
    credential_generation_hash             text,
    endpoint_class                         text        NOT NULL,
    endpoint_binding_hash                  text,
    retry_policy_hash                      text        NOT NULL,
    profile_payload_hash                   text        NOT NULL,
    -- action config snapshot
    create_path_template                   text        NOT NULL,
    update_path_template                   text        NOT NULL,
    response_id_path                       text        NOT NULL,
    mirror_source_object                   text,
    mirror_remote_id_field                 text,
    mirror_provenance_field                text,
    mapping_fingerprint                    text        NOT NULL,
    body_fingerprint                       text        NOT NULL,
    -- the remote object
    remote_id                              text        NOT NULL CHECK (remote_id <> ''),
    remote_scope                           text        NOT NULL,
    -- state
    status                                 text        NOT NULL,
    suspend_reason                         text,
    drift_findings                         jsonb       NOT NULL DEFAULT '[]'
        CHECK (jsonb_typeof(drift_findings) = 'array'),
    last_mapping_revalidation_operation_id text,
    mirror_status                          text,
    row_version                            bigint      NOT NULL DEFAULT 1,
    last_operator                          text,
    last_operator_reason                   text,
    last_operator_at                       timestamptz,
    created_at                             timestamptz NOT NULL DEFAULT now(),
    updated_at                             timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT connector_remote_link_mirror_tuple_ck CHECK (
        num_nulls(mirror_source_object, mirror_remote_id_field, mirror_provenance_field) IN (0, 3)
    )
);

-- ID-6 lineage checks look links up by stable slot.
CREATE INDEX connector_remote_link_action_slot_ix
    ON connector_remote_link (connector_owner_key, action_slot_id);

CREATE TRIGGER connector_remote_link_touch_tg BEFORE UPDATE ON connector_remote_link
    FOR EACH ROW EXECUTE FUNCTION touch_versioned_row();

-- ---------------------------------------------------------------------------
-- Revalidation receipts (§9, STO-4): append-only history of mapping moves.

CREATE TABLE connector_link_revalidation_receipt (
    operation_id                  text        NOT NULL,
    link_key                      text        NOT NULL
        REFERENCES connector_remote_link (link_key),
    manifest_digest               text        NOT NULL,
    approval_digest               text        NOT NULL,
    mapping_fingerprint_algorithm text        NOT NULL,
    body_fingerprint_algorithm    text        NOT NULL,
    old_mapping_fingerprint       text        NOT NULL,
    new_mapping_fingerprint       text        NOT NULL,
    old_body_fingerprint          text        NOT NULL,
    new_body_fingerprint          text        NOT NULL,
    old_pack_install_id           uuid        NOT NULL,
    new_pack_install_id           uuid        NOT NULL,
    -- the receipt chain: the link's pointer before this operation
    previous_operation_id         text,
    before_row_digest             text        NOT NULL,
    after_row_digest              text        NOT NULL,
    created_at                    timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (operation_id, link_key)
);

CREATE TRIGGER connector_link_revalidation_receipt_append_only_tg
    BEFORE UPDATE OR DELETE ON connector_link_revalidation_receipt
    FOR EACH ROW EXECUTE FUNCTION reject_append_only_write();
CREATE TRIGGER connector_link_revalidation_receipt_no_truncate_tg
    BEFORE TRUNCATE ON connector_link_revalidation_receipt
    FOR EACH STATEMENT EXECUTE FUNCTION reject_append_only_write();

-- The link's current-receipt pointer must name a receipt for this same link.
ALTER TABLE connector_remote_link
    ADD CONSTRAINT connector_remote_link_revalidation_receipt_fk
    FOREIGN KEY (last_mapping_revalidation_operation_id, link_key)
    REFERENCES connector_link_revalidation_receipt (operation_id, link_key);

-- ---------------------------------------------------------------------------
-- Create attempts (STO-2). No foreign key to the link: the link row is only
-- written when the attempt learns the remote id.

CREATE TABLE connector_push_attempt (
    attempt_id              uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    link_key                text        NOT NULL CHECK (link_key ~ '^lk[0-9]+_[0-9a-f]{64}$'),
    connector_owner_key     text        NOT NULL,
    action_slot_id          text        NOT NULL,
    action_type             text        NOT NULL,
    source_object           text        NOT NULL,
    source_record_id        text        NOT NULL,
    destination_slot_id     text        NOT NULL,
    connector_namespace     text        NOT NULL,
    flow_developer_name     text        NOT NULL,
    flow_action_name        text        NOT NULL,
    flow_version            text,
    target_object           text        NOT NULL,
    profile_name            text        NOT NULL,
    pack_install_id         uuid        NOT NULL REFERENCES pack_install (pack_install_id),
    -- LANE-1: any text is storable so an unknown lane is left untouched, never
    -- rejected or normalised; claims name their allowed lanes.
    dispatch_lane           text        NOT NULL DEFAULT 'configured',
    status                  text        NOT NULL,
    -- REC-1 fencing: a fresh token per claim; checkpoints CAS on it.
    claim_token             uuid,
    claimed_at              timestamptz,
    claim_expires_at        timestamptz,
    remote_io_started_at    timestamptz,
    attempt_ordinal         integer     NOT NULL CHECK (attempt_ordinal >= 1),
    request_idempotency_key text        NOT NULL CHECK (request_idempotency_key <> ''),
    -- frozen request: method, relative path, replay-safe headers, body, body
    -- hash, target, profile snapshot, responseIdPath, mirror tuple, locator value
    request_snapshot        jsonb       NOT NULL CHECK (jsonb_typeof(request_snapshot) = 'object'),
    -- frozen authority: user, record, allowed fields, decision time, mapping fingerprint
    authority_snapshot      jsonb       NOT NULL
        CHECK (jsonb_typeof(authority_snapshot) = 'object'),
    -- position-aligned association source ids, blanks kept (LANE-2, LANE-3)
    association_source_ids  jsonb
        CHECK (jsonb_typeof(association_source_ids) = 'array'),
    response_snapshot       jsonb,
    remote_id               text,
    writeback_snapshot      jsonb,
    mirror_status           text,
    retry_count             integer     NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    last_error              text,
    superseded_by           uuid
        REFERENCES connector_push_attempt (attempt_id) DEFERRABLE INITIALLY DEFERRED,
    last_operator           text,
    last_operator_reason    text,
    last_operator_at        timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT connector_push_attempt_superseded_by_ck
        CHECK (superseded_by IS NULL OR status = 'superseded'),
    -- LANE-3: a deferred attempt without its frozen vector fails closed.
    CONSTRAINT connector_push_attempt_deferred_vector_ck
        CHECK (dispatch_lane <> 'deferred_association' OR association_source_ids IS NOT NULL)
);

CREATE UNIQUE INDEX connector_push_attempt_ordinal_uq
    ON connector_push_attempt (link_key, attempt_ordinal);
CREATE UNIQUE INDEX connector_push_attempt_idempotency_key_uq
    ON connector_push_attempt (request_idempotency_key);
CREATE INDEX connector_push_attempt_claim_ix
    ON connector_push_attempt (dispatch_lane, status, claim_expires_at);

CREATE TRIGGER connector_push_attempt_touch_tg BEFORE UPDATE ON connector_push_attempt
    FOR EACH ROW EXECUTE FUNCTION touch_row();

-- ---------------------------------------------------------------------------
-- PATCH dispatches (§5.5): queued and in-flight updates of a finalized link.

CREATE TABLE connector_patch_dispatch (
    patch_id                uuid        PRIMARY KEY DEFAULT gen_random_uuid(),
    link_key                text        NOT NULL REFERENCES connector_remote_link (link_key),
    dispatch_lane           text        NOT NULL DEFAULT 'configured',
    status                  text        NOT NULL,
    claim_token             uuid,
    claimed_at              timestamptz,
    claim_expires_at        timestamptz,
    remote_io_started_at    timestamptz,
    request_idempotency_key text,
    -- built from the latest record state at dispatch, so empty while queued
    body                    jsonb,
    body_fingerprint        text,
    authority_snapshot      jsonb CHECK (jsonb_typeof(authority_snapshot) = 'object'),
    update_path             text,
    response_snapshot       jsonb,
    retry_count             integer     NOT NULL DEFAULT 0 CHECK (retry_count >= 0),
    last_error              text,
    superseded_by           uuid
        REFERENCES connector_patch_dispatch (patch_id) DEFERRABLE INITIALLY DEFERRED,
    last_operator           text,
    last_operator_reason    text,
    last_operator_at        timestamptz,
    created_at              timestamptz NOT NULL DEFAULT now(),
    updated_at              timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT connector_patch_dispatch_superseded_by_ck
        CHECK (superseded_by IS NULL OR status = 'superseded')
);

CREATE INDEX connector_patch_dispatch_link_ix ON connector_patch_dispatch (link_key, status);
CREATE INDEX connector_patch_dispatch_claim_ix
    ON connector_patch_dispatch (dispatch_lane, status, claim_expires_at);

CREATE TRIGGER connector_patch_dispatch_touch_tg BEFORE UPDATE ON connector_patch_dispatch
    FOR EACH ROW EXECUTE FUNCTION touch_row();

-- ---------------------------------------------------------------------------
-- BEGIN GENERATED by db/transition_sql.py from protocol/states.py: regenerate, never edit

SET LOCAL client_min_messages = warning;

-- lifecycle `link` on connector_remote_link; a new row starts in finalized.
ALTER TABLE connector_remote_link
    DROP CONSTRAINT IF EXISTS connector_remote_link_status_ck,
    ADD CONSTRAINT connector_remote_link_status_ck
        CHECK (status IN ('finalized', 'suspended_drift', 'retired'));

CREATE OR REPLACE FUNCTION connector_remote_link_guard_status() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status IS DISTINCT FROM 'finalized' THEN
            RAISE EXCEPTION 'link: a new row must start in finalized, not %', NEW.status
                USING ERRCODE = 'CP002', TABLE = TG_TABLE_NAME, COLUMN = 'status',
                      DETAIL = json_build_object('lifecycle', 'link', 'to', NEW.status)::text;
        END IF;
        RETURN NEW;
    END IF;
    IF (CASE OLD.status
        WHEN 'finalized' THEN NEW.status IN ('suspended_drift', 'retired')
        WHEN 'suspended_drift' THEN NEW.status IN ('finalized', 'retired')
        WHEN 'retired' THEN false
        ELSE false
    END) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'link: illegal transition % -> %', OLD.status, NEW.status
        USING ERRCODE = 'CP001', TABLE = TG_TABLE_NAME, COLUMN = 'status',
              DETAIL = json_build_object('lifecycle', 'link', 'from', OLD.status, 'to', NEW.status)::text;
END;
$guard$;

DROP TRIGGER IF EXISTS connector_remote_link_status_insert_tg ON connector_remote_link;
CREATE TRIGGER connector_remote_link_status_insert_tg BEFORE INSERT ON connector_remote_link
    FOR EACH ROW EXECUTE FUNCTION connector_remote_link_guard_status();
DROP TRIGGER IF EXISTS connector_remote_link_status_update_tg ON connector_remote_link;
CREATE TRIGGER connector_remote_link_status_update_tg BEFORE UPDATE OF status ON connector_remote_link
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION connector_remote_link_guard_status();

-- lifecycle `attempt` on connector_push_attempt; a new row starts in pending.
ALTER TABLE connector_push_attempt
    DROP CONSTRAINT IF EXISTS connector_push_attempt_status_ck,
    ADD CONSTRAINT connector_push_attempt_status_ck
        CHECK (status IN ('pending', 'processing', 'post_sent', 'ambiguous_remote_effect', 'writeback_pending', 'finalized', 'terminal_failed', 'superseded'));

CREATE OR REPLACE FUNCTION connector_push_attempt_guard_status() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status IS DISTINCT FROM 'pending' THEN
            RAISE EXCEPTION 'attempt: a new row must start in pending, not %', NEW.status
                USING ERRCODE = 'CP002', TABLE = TG_TABLE_NAME, COLUMN = 'status',
                      DETAIL = json_build_object('lifecycle', 'attempt', 'to', NEW.status)::text;
        END IF;
        RETURN NEW;
    END IF;
    IF (CASE OLD.status
        WHEN 'pending' THEN NEW.status IN ('processing', 'terminal_failed')
        WHEN 'processing' THEN NEW.status IN ('pending', 'post_sent', 'ambiguous_remote_effect', 'writeback_pending', 'terminal_failed')
        WHEN 'post_sent' THEN NEW.status IN ('ambiguous_remote_effect', 'writeback_pending', 'terminal_failed')
        WHEN 'ambiguous_remote_effect' THEN NEW.status IN ('writeback_pending')
        WHEN 'writeback_pending' THEN NEW.status IN ('finalized', 'terminal_failed')
        WHEN 'finalized' THEN false
        WHEN 'terminal_failed' THEN NEW.status IN ('superseded')
        WHEN 'superseded' THEN false
        ELSE false
    END) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'attempt: illegal transition % -> %', OLD.status, NEW.status
        USING ERRCODE = 'CP001', TABLE = TG_TABLE_NAME, COLUMN = 'status',
              DETAIL = json_build_object('lifecycle', 'attempt', 'from', OLD.status, 'to', NEW.status)::text;
END;
$guard$;

DROP TRIGGER IF EXISTS connector_push_attempt_status_insert_tg ON connector_push_attempt;
CREATE TRIGGER connector_push_attempt_status_insert_tg BEFORE INSERT ON connector_push_attempt
    FOR EACH ROW EXECUTE FUNCTION connector_push_attempt_guard_status();
DROP TRIGGER IF EXISTS connector_push_attempt_status_update_tg ON connector_push_attempt;
CREATE TRIGGER connector_push_attempt_status_update_tg BEFORE UPDATE OF status ON connector_push_attempt
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION connector_push_attempt_guard_status();

-- lifecycle `patch` on connector_patch_dispatch; a new row starts in pending.
ALTER TABLE connector_patch_dispatch
    DROP CONSTRAINT IF EXISTS connector_patch_dispatch_status_ck,
    ADD CONSTRAINT connector_patch_dispatch_status_ck
        CHECK (status IN ('pending', 'processing', 'succeeded', 'ambiguous_remote_effect', 'failed', 'superseded'));

CREATE OR REPLACE FUNCTION connector_patch_dispatch_guard_status() RETURNS trigger
LANGUAGE plpgsql AS $guard$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.status IS DISTINCT FROM 'pending' THEN
            RAISE EXCEPTION 'patch: a new row must start in pending, not %', NEW.status
                USING ERRCODE = 'CP002', TABLE = TG_TABLE_NAME, COLUMN = 'status',
                      DETAIL = json_build_object('lifecycle', 'patch', 'to', NEW.status)::text;
        END IF;
        RETURN NEW;
    END IF;
    IF (CASE OLD.status
        WHEN 'pending' THEN NEW.status IN ('processing', 'superseded')
        WHEN 'processing' THEN NEW.status IN ('pending', 'succeeded', 'ambiguous_remote_effect', 'failed')
        WHEN 'succeeded' THEN false
        WHEN 'ambiguous_remote_effect' THEN false
        WHEN 'failed' THEN NEW.status IN ('superseded')
        WHEN 'superseded' THEN false
        ELSE false
    END) THEN
        RETURN NEW;
    END IF;
    RAISE EXCEPTION 'patch: illegal transition % -> %', OLD.status, NEW.status
        USING ERRCODE = 'CP001', TABLE = TG_TABLE_NAME, COLUMN = 'status',
              DETAIL = json_build_object('lifecycle', 'patch', 'from', OLD.status, 'to', NEW.status)::text;
END;
$guard$;

DROP TRIGGER IF EXISTS connector_patch_dispatch_status_insert_tg ON connector_patch_dispatch;
CREATE TRIGGER connector_patch_dispatch_status_insert_tg BEFORE INSERT ON connector_patch_dispatch
    FOR EACH ROW EXECUTE FUNCTION connector_patch_dispatch_guard_status();
DROP TRIGGER IF EXISTS connector_patch_dispatch_status_update_tg ON connector_patch_dispatch;
CREATE TRIGGER connector_patch_dispatch_status_update_tg BEFORE UPDATE OF status ON connector_patch_dispatch
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
    EXECUTE FUNCTION connector_patch_dispatch_guard_status();

-- ID-5: one attempt per link key occupies the create slot (active or an
-- unsuperseded terminal_failed); only released states free it.
DROP INDEX IF EXISTS connector_push_attempt_one_occupying_uq;
CREATE UNIQUE INDEX connector_push_attempt_one_occupying_uq
    ON connector_push_attempt (link_key) WHERE status NOT IN ('finalized', 'superseded');

-- ID-4: a remote locator belongs to at most one non-retired link.
DROP INDEX IF EXISTS connector_remote_link_locator_uq;
CREATE UNIQUE INDEX connector_remote_link_locator_uq
    ON connector_remote_link (connector_owner_key, destination_slot_id, remote_scope, remote_id)
    WHERE status <> 'retired';

-- END GENERATED by db/transition_sql.py
