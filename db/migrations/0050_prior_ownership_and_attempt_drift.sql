-- GATE-1 (issue 15): the prior-ownership gate reads every link and attempt of one
-- owner's source record, whatever its action or destination slot, at admission.
CREATE INDEX connector_remote_link_record_ix
    ON connector_remote_link (connector_owner_key, source_object, source_record_id);
CREATE INDEX connector_push_attempt_record_ix
    ON connector_push_attempt (connector_owner_key, source_object, source_record_id);

-- GATE-2 (issue 15): the drift findings of the attempt's frozen snapshot against the
-- live pack, recorded under the claim before the first POST (fail-closed ones with
-- the move to terminal_failed, benign ones as they are).
ALTER TABLE connector_push_attempt ADD COLUMN drift_findings jsonb;
