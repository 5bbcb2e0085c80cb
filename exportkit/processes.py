"""Whether a process still runs: stale staging dirs, build dirs and containers are told apart by their owner's PID."""
from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """True while `pid` runs (another user's process counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
