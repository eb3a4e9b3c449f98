"""`python -m ingress [CONFIG]`: the server without the CLI (used by process-level tests)."""

from __future__ import annotations

import sys
from pathlib import Path

from ingress.server import serve

if __name__ == "__main__":
    serve(Path(sys.argv[1]) if len(sys.argv) > 1 else None)
