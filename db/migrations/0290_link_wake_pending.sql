-- WF-4, REC-3: a link suspended where no workflow runs (pack apply suspends the links of
-- a removed action slot, C-9) is flagged for the relay, which wakes its workflow once
-- (the run loads the link, finds it suspended and stays open with NeedsOperator), then
-- clears the flag. Without it such a link was parked but listed by nobody's query.
ALTER TABLE connector_remote_link ADD COLUMN wake_pending boolean NOT NULL DEFAULT false;
CREATE INDEX connector_remote_link_wake_pending_ix
    ON connector_remote_link (link_key) WHERE wake_pending;
