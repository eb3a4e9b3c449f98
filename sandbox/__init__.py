"""Sandbox remote: a HubSpot-shaped HTTP server with fault injection and a create ledger."""
