-- The remote's entity tag as last seen (create or PATCH response). A profile
-- that declares a precondition header (e.g. If-Match) sends it on PATCH, so an
-- out-of-band change answers 412 and suspends the link instead of being
-- overwritten (SPEC PATCH-3, seed "remote changed out-of-band").
ALTER TABLE connector_remote_link ADD COLUMN remote_etag text;
