"""Sandbox remote: an HTTP server in one of three modes (HubSpot-shaped and generous,
HubSpot-exact, Salesforce-shaped), with fault injection and a create ledger."""
