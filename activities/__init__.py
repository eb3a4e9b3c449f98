"""The Temporal activity classes the worker registers, and nothing else: thin adapters that
decode an input, call an operation in `services/`, and map its errors to the non-retryable
types the workflows know (STYLE 16)."""
