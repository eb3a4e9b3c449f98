"""Test harness: real Postgres and a real Temporal server, shared per session.

Fixture plugins live in `tests/fixtures/` (one file per component) so each
component's harness has one home.

A `DATABASE_URL` / `TEMPORAL_ADDRESS` left exported in the shell (docs/operating.md's dev
exports) is ignored, so `make test` never runs against a developer's stack; set
`CONNECTOR_PUSH_TEST_USE_ENV=1` to host the test databases on `DATABASE_URL` on purpose.
"""

import os
import signal

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

# A suite started in the background by a non-interactive shell (`make test &`, a job
# runner's script) inherits SIGINT ignored: POSIX has an asynchronous list ignore SIGINT,
# and exec keeps an ignored signal ignored. Every command a test then starts (a
# `python -m cli` child, or tests/cli_zygote.py's forks) would ignore it too, and the
# Ctrl-C tests (test_push, test_bench_scale) would signal a process that cannot hear:
# seen as push runs that never ended. The commands here run as an operator's terminal
# starts them, with Python's own SIGINT handling (a handler, reset to the default for
# each exec'd child, which then installs its own).
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = [
    "tests.fixtures.postgres",
    "tests.fixtures.temporal",
    "tests.fixtures.schedule",
    "tests.fixtures.assert_cache",
]
