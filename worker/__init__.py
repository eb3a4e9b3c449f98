"""connector-push: worker layer."""
