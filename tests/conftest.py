"""Test harness: real Postgres and a real Temporal server, shared per session.

Fixture plugins live in `tests/fixtures/` (one file per component) so each
component's harness has one home.

A `DATABASE_URL` / `TEMPORAL_ADDRESS` left exported in the shell (docs/operating.md's dev
exports) is ignored, so `make test` never runs against a developer's stack; set
`CONNECTOR_PUSH_TEST_USE_ENV=1` to host the test databases on `DATABASE_URL` on purpose.
"""

import os

from hypothesis import settings

# Property tests assert behaviour, not speed: a per-example deadline only measures how
# loaded the machine is (seen: DeadlineExceeded on a CI-like box running a campaign).
settings.register_profile("connector-push", deadline=None)
settings.load_profile("connector-push")

USE_ENV = "CONNECTOR_PUSH_TEST_USE_ENV"
SHELL_EXPORTS = ("DATABASE_URL", "TEMPORAL_ADDRESS", "TEMPORAL_NAMESPACE")

if os.environ.get(USE_ENV) != "1":
    for name in SHELL_EXPORTS:
        os.environ.pop(name, None)

# pytest-xdist's workers inherit COLUMNS=80 and LINES=24 from the controller's terminal;
# the CLI run in-process (or forked, tests/cli_zygote.py) would take them for the
# terminal's size and fold piped tables to 80 columns, as no piped process does.
for name in ("COLUMNS", "LINES"):
    os.environ.pop(name, None)

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.temporal",
    "tests.fixtures.schedule",
    "tests.fixtures.assert_cache",
]
