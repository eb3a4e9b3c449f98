"""connector-push: workflows layer."""
