"""connector-push: ingress layer."""
