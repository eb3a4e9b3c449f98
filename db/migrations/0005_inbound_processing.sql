-- Inbound processing (SPEC ING-6, ING-7). The route's facts are fixed at
-- admission, so processing needs no ingress configuration: the handler, which
-- links' `target_object` the remote object belongs to, and the remote object id.
ALTER TABLE connector_event
    ADD COLUMN target_object    text,
    ADD COLUMN remote_object_id text;

-- A must-complete execution carries the same facts for the event it enqueues.
ALTER TABLE workflow_action_execution
    ADD COLUMN handler           text,
    ADD COLUMN target_object     text,
    ADD COLUMN remote_object_id  text,
    -- How many completion requests were sent (the delivery phase's evidence).
    ADD COLUMN callback_attempts integer NOT NULL DEFAULT 0 CHECK (callback_attempts >= 0);

-- Deletion events look up the finalized links owning a remote object.
CREATE INDEX connector_remote_link_remote_object_ix
    ON connector_remote_link (target_object, remote_id);
