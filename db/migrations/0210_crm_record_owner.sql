-- SPEC S-1 (a save API client acts only for its owners; the record's owner is known to
-- the store): each local record carries the connector owner key it belongs to. The save
-- API refuses (403, nothing written) a save whose record belongs to another owner, or
-- to none: a record loaded before this migration has no owner until it is loaded again
-- with one (`connector-push records load`, `owner:`), and until then no API client may
-- save it. The CLI and the in-process entries are operators' and are not scoped.

ALTER TABLE crm_record
    ADD COLUMN owner_key text CHECK (owner_key IS NULL OR owner_key <> '');
