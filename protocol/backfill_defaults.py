"""The backfill's defaults (SPEC MIG-1), free of imports: `connector-push backfill` shows
them in its help, and the CLI builds its command tree without loading the services
(a fast start). `services.backfill` re-exports them."""

from __future__ import annotations

from typing import Final

DEFAULT_BATCH_SIZE: Final = 500
DEFAULT_OPERATOR: Final = "backfill"
