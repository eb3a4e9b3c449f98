-- SPEC G-8 (evidence follows the link): a remote-deletion event is recorded whatever the
-- state of the links that name its object, and with no link at all. The event row
-- itself (connector_event) is pruned once finished (OPS-3); this row is the evidence
-- that stays, keyed by the remote object (target object, remote scope, remote id), and
-- reconcile and revalidate consult it before they tie a link to that object again.
-- Written in the transaction that settles the event; never updated, deleted or pruned.

CREATE TABLE connector_remote_deletion (
    -- the connector_event that reported it (no foreign key: that row may be pruned)
    event_id      text        PRIMARY KEY,
    target_object text        NOT NULL CHECK (target_object <> ''),
    remote_scope  text        NOT NULL,
    remote_id     text        NOT NULL CHECK (remote_id <> ''),
    event_type    text        NOT NULL,
    endpoint      text        NOT NULL,
    recorded_at   timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX connector_remote_deletion_object_ix
    ON connector_remote_deletion (target_object, remote_id, remote_scope, recorded_at);

CREATE TRIGGER connector_remote_deletion_append_only_tg
    BEFORE UPDATE OR DELETE ON connector_remote_deletion
    FOR EACH ROW EXECUTE FUNCTION reject_append_only_write();
CREATE TRIGGER connector_remote_deletion_no_truncate_tg
    BEFORE TRUNCATE ON connector_remote_deletion
    FOR EACH STATEMENT EXECUTE FUNCTION reject_append_only_write();

-- Deletion events already settled (and not yet pruned) before this migration.
INSERT INTO connector_remote_deletion
    (event_id, target_object, remote_scope, remote_id, event_type, endpoint, recorded_at)
SELECT event_id, target_object, remote_scope, remote_object_id, event_type, endpoint, updated_at
FROM connector_event
WHERE handler = 'remote_deletion' AND status <> 'admitted'
  AND target_object <> '' AND remote_scope IS NOT NULL AND remote_object_id <> '';
