"""connector-push: protocol layer."""
