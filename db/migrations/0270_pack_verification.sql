-- `pack verify` results (SPEC §14.2, §17 G-1): what a profile's claims were found to be
-- on a test account, stored with the digest of the pack that was verified, so `pack
-- apply` can refuse a profile whose replay-safety or precondition claim was found not
-- holding (or, in production, never verified) for the very manifest it installs.
-- Append-only: each run adds a row; the newest row of (digest, profile) is the one read.

CREATE TABLE connector_pack_verification (
    verification_id  bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    manifest_digest  text NOT NULL CHECK (manifest_digest <> ''),
    profile_name     text NOT NULL CHECK (profile_name <> ''),
    -- The base URL probed (never a credential): where the evidence came from.
    base_url         text NOT NULL,
    -- [{claim, finding, evidence}], finding one of holds / does_not_hold / not_tested.
    results          jsonb NOT NULL CHECK (jsonb_typeof(results) = 'array'),
    operator         text NOT NULL CHECK (operator <> ''),
    verified_at      timestamptz NOT NULL DEFAULT clock_timestamp()
);

CREATE INDEX connector_pack_verification_latest
    ON connector_pack_verification (manifest_digest, profile_name, verification_id DESC);

-- Append-only for every application role, as the audit trail is (S-4): read and insert.
ALTER TABLE connector_pack_verification OWNER TO connector_push_migrator;
REVOKE ALL ON connector_pack_verification FROM PUBLIC;
GRANT SELECT, INSERT ON connector_pack_verification
    TO connector_push_worker, connector_push_operator;
GRANT SELECT ON connector_pack_verification TO connector_push_save_api;
