"""The local stack: embedded Postgres, Temporal dev server, child processes."""
