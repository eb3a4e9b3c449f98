"""The local stack, for development only: `connector-push dev` (embedded Postgres, the
Temporal dev server, the worker, ingress and sandbox remote as supervised children, the
demo data) and `connector-push sandbox`.

Not in the wheel (pyproject.toml excludes `cli.stack`, as it leaves out `sandbox`): a
checkout's editable install has both, and `cli.main` registers `dev` and `sandbox` only
where they are importable. The runtime commands take `temporal-dev.yaml`'s addresses as
their defaults through `cli.local_stack`, when this package is there.
"""
