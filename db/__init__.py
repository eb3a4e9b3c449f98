"""connector-push: db layer."""
