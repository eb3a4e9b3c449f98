-- Issue 33 item 3: a try answered 429 with the remote's daily policy named (HubSpot's
-- `policyName: DAILY`). Such a refusal is the budget's day ending, not the remote being
-- busy: the attempt waits until the quota's reset, and PROF-1's time budget for "not
-- applied" answers counts again from the first refusal after it (protocol/recovery.py),
-- so a day's wait never parks or fails the attempt. Written with the outcome, once.
ALTER TABLE connector_send_journal ADD COLUMN daily_refusal boolean NOT NULL DEFAULT false;
