-- The create path freezes the whole action-config and profile snapshots, not
-- only the hashes: the link needs them to render PATCHes and to classify drift
-- (DRIFT-1) without re-reading the pack, and the attempt needs its action
-- snapshot to create the link exactly as it was reserved (STO-1, STO-2).
ALTER TABLE connector_push_attempt
    ADD COLUMN action_snapshot jsonb CHECK (jsonb_typeof(action_snapshot) = 'object');
ALTER TABLE connector_remote_link
    ADD COLUMN profile_snapshot jsonb CHECK (jsonb_typeof(profile_snapshot) = 'object');
