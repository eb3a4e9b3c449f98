-- Issue 33 item 3 (SPEC NF-8): what each remote budget spent of its declared daily quota,
-- per quota day (the date in the quota's reset time zone). One row per budget and day;
-- every request sent under a budget with a `dailyQuota` adds one to `spent` in a single
-- conditional UPSERT (db/daily_quota.py), so two workers never both spend the last unit.
-- `allowance` and `resets_at` are what the spender knew (the share of the quota, the next
-- midnight): `status` shows them without reading packs. `refused_at`: the remote answered
-- a 429 naming its daily policy, so the whole budget waits until `resets_at`.
CREATE TABLE connector_daily_quota (
    budget_key text NOT NULL,
    quota_day date NOT NULL,
    spent integer NOT NULL DEFAULT 0 CHECK (spent >= 0),
    allowance integer CHECK (allowance >= 0),
    resets_at timestamptz NOT NULL,
    refused_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (budget_key, quota_day)
);
-- `status` lists the budgets whose day has not ended.
CREATE INDEX connector_daily_quota_resets_ix ON connector_daily_quota (resets_at);
