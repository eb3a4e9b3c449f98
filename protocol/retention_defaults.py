"""Retention's defaults (SPEC OPS-3), free of imports: `connector-push prune` shows them in
its help, and the CLI builds its command tree without loading pydantic (a fast start).
`protocol.retention` re-exports them for the models and settings that use them."""

from __future__ import annotations

from typing import Final

# PATCH rows kept per link beyond the age cut (the newest ones, finished or not).
DEFAULT_KEEP_PATCHES: Final = 20
DEFAULT_BATCH_SIZE: Final = 1000
