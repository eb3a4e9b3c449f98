"""The garbage collector's policy for our long-running and bulk processes (NF-7, P1, P5).

CPython frees almost every object by reference counting; the cyclic collector only
finds cycles. By default it runs a young-generation pass every 700 net allocations and
a full pass, over every tracked object of the process, every hundred of those. A bulk
command allocates tens of thousands of short-lived objects per page (pydantic models,
decoded rows, snapshots), so the collector ran thousands of times and re-scanned every
imported module's objects at each full pass: measured on `push --all` of 100,000
records, 6.1 s of its 29 s of CPU (gc.callbacks), 4.1 s of it in 73 full passes.

So, once the process has imported what it runs:
- `gc.freeze()`: every object alive now (modules, classes, the pydantic schemas) is
  moved out of the collector's reach, never scanned again. No collection runs first: at
  CLI start it costs ~12 ms and finds ~5 stray objects, which stay for the process's
  life instead.
- a CLI command's young generation is `YOUNG_THRESHOLD` net allocations: the collector
  still runs, but a page's short-lived objects are freed by reference counting first.

The worker keeps CPython's young threshold (`WORKER_YOUNG_THRESHOLD`). Its
garbage is not a page's short-lived objects but whole workflow runs: each run the sticky
cache holds is a sandbox of re-imported modules (module dicts, functions, classes: cycles
by nature), alive long enough to reach the oldest generation, and garbage only when the
cache evicts it. Only a full pass frees it, and a full pass comes every 100 young ones:
at 50,000 that is every 5,000,000 allocations, while evicted runs piled up. P5 (10,000
parked links, cache 500) read 724 MB with the CLI's threshold in the worker, 224 MB
before it; in one A/B run at 3,000 links, 362 MB against 229 MB with this policy and
232 MB with none (`BENCH_P5_ARMS`, docs/testing-and-benchmarks.md). The freeze stays:
alone it costs no memory, and it keeps the imports out of the full passes.
"""

from __future__ import annotations

import gc
from typing import Final

YOUNG_THRESHOLD: Final = 50_000  # a CLI command (bulk pages)
WORKER_YOUNG_THRESHOLD: Final = 700  # the worker: CPython's default (module doc)
OLDER_THRESHOLDS: Final = (10, 10)  # CPython's defaults for the two older generations


def apply_gc_policy(young_threshold: int = YOUNG_THRESHOLD) -> None:
    """Freeze what is alive now and set the young generation's threshold; idempotent."""
    gc.freeze()
    gc.set_threshold(young_threshold, *OLDER_THRESHOLDS)
