"""How many examples a property test draws: its full count under `CONNECTOR_PUSH_THOROUGH=1`
(a release check, or after touching what it covers), a quarter of it in `make test`.

The equivalence properties (fast paths against their reference readings) drew 1,000 to
2,000 examples each on every run: ~45 s of the suite's CPU for a margin that only
matters when the code under them changes (issue 31). Hypothesis keeps every failing
example it finds in its database, so a failure found once is retried first.
"""

from __future__ import annotations

import os

THOROUGH = os.environ.get("CONNECTOR_PUSH_THOROUGH") == "1"


def examples(full: int) -> int:
    """`full` when thorough, else a quarter of it (never below 50)."""
    return full if THOROUGH else max(50, full // 4)
