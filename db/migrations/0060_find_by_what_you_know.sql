-- SPEC OPS-1: `connector-push links find --record-id | --remote-id` answers from
-- Postgres without scanning every link and attempt. A link key's rows are its link
-- (once finalized) and its attempts (from the reservation on), so both are indexed.
CREATE INDEX connector_remote_link_source_record_ix
    ON connector_remote_link (source_record_id);
CREATE INDEX connector_push_attempt_source_record_ix
    ON connector_push_attempt (source_record_id);
CREATE INDEX connector_remote_link_remote_id_ix
    ON connector_remote_link (remote_id);
CREATE INDEX connector_push_attempt_remote_id_ix
    ON connector_push_attempt (remote_id) WHERE remote_id IS NOT NULL;
-- Parked creates for `links find --park-reason` (the parked set is small).
CREATE INDEX connector_push_attempt_parked_ix
    ON connector_push_attempt (link_key)
    WHERE status IN ('ambiguous_remote_effect', 'terminal_failed');
