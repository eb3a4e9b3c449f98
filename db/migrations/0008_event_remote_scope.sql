-- A remote-deletion event names an object id that is only unique within one remote
-- account (HubSpot: a portal). The route maps the event's account field to the
-- links' `remote_scope`; an event whose account is not mapped suspends nothing.
ALTER TABLE connector_event ADD COLUMN remote_scope text;
ALTER TABLE workflow_action_execution ADD COLUMN remote_scope text;
