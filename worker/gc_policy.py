"""The garbage collector's policy for our long-running and bulk processes (issue 34, 32).

CPython frees almost every object by reference counting; the cyclic collector only
finds cycles. By default it runs a young-generation pass every 700 net allocations and
a full pass, over every tracked object of the process, every hundred of those. A bulk
command or the worker allocates tens of thousands of short-lived objects per page
(pydantic models, decoded rows, snapshots), so the collector ran thousands of times
and re-scanned every imported module's objects at each full pass: measured on
`push --all` of 100,000 records, 6.1 s of its 29 s of CPU (gc.callbacks), 4.1 s of it
in 73 full passes.

So, once the process has imported what it runs:
- `gc.freeze()`: every object alive now (modules, classes, the pydantic schemas) is
  moved out of the collector's reach, never scanned again. No collection runs first: at
  CLI start it costs ~12 ms and finds ~5 stray objects, which stay for the process's
  life instead.
- a young generation of `YOUNG_THRESHOLD` net allocations: the collector still runs
  (cycles are still freed, and memory stays bounded by what that many allocations
  hold), but a page's short-lived objects are freed by reference counting first.
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_THRESHOLD: Final = 50_000
OLDER_THRESHOLDS: Final = (10, 10)  # CPython's defaults for the two older generations


def apply_gc_policy() -> None:
    """Freeze what is alive now and raise the young generation's threshold; idempotent."""
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, *OLDER_THRESHOLDS)
