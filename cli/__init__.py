"""connector-push: cli layer."""
