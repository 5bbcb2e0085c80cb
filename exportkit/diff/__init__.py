"""`exportkit diff OLD NEW`: what a new version changes for the clients of the old one, on the same inputs or
records; command.py runs both versions through the runtimes, report.py holds the changes, gates and renderings."""
