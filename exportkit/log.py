"""The `exportkit` logger: notes and progress from inside the pipeline (a managed environment being installed, a
stale container removed, --data progress). The CLI prints them on stderr; a Python caller configures logging."""
import logging

log = logging.getLogger("exportkit")
