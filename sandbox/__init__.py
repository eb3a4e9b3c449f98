"""connector-push: sandbox layer."""
