"""`python -m cli` runs the `connector-push` command (used to start child processes)."""

from cli.main import app

if __name__ == "__main__":
    app()
