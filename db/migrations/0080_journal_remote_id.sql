-- JRN-1 (seed "After POST" 1: persist the response snapshot and extracted remote id):
-- the remote id a create's answer named, written with that try's outcome, once (the
-- journal guard refuses any write after the outcome). The attempt row holds it too when
-- the finalize applies; this keeps it when it does not - a try that outlived its
-- timeout and was answered after a retry had claimed or parked the attempt - so the
-- operator reconciles with the id the runtime already learned.
ALTER TABLE connector_send_journal ADD COLUMN remote_id text;
