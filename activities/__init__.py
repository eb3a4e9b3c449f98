"""connector-push: activities layer."""
