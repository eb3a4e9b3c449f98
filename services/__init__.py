"""The application's operations: admission, the save entry, records, packs, revalidation,
backfill, operator actions, wake-ups and status, shared by the CLI, the ingress's save
API, the worker's CRM entry and the Temporal activity classes in `activities/`."""
