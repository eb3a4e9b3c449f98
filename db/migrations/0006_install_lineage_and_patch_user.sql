-- Install lineage: an apply that replaces the active install records the
-- install it upgraded; a reinstall (a new incarnation of the pack after it was
-- removed) does not. The drift classifier treats a link frozen under an
-- ancestor of the active install as "upgraded" (validated surface by surface)
-- and any other install change as a rebirth that fails closed (seed: Identity
-- Model, "same-name pack rebirth").
ALTER TABLE pack_install
    ADD COLUMN previous_pack_install_id uuid REFERENCES pack_install (pack_install_id);

-- The user whose save queued a PATCH: the body is built at dispatch from the
-- latest record under this user's current authority (PATCH-2, PACK-2).
ALTER TABLE connector_patch_dispatch
    ADD COLUMN originating_user_id text;

-- PATCH-2: at most one queued PATCH per link (saves coalesce into it).
CREATE UNIQUE INDEX connector_patch_dispatch_one_pending_uq
    ON connector_patch_dispatch (link_key) WHERE status = 'pending';
