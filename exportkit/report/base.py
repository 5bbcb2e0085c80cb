"""What every command's result offers its renderers, the report files and the faces: `passed`, `exit_code`,
`verdict` (the one last line) and `to_dict` (the `--json` document). Each command's report (verify/report.py,
compat/report.py, diff/report.py, export/report.py) is a dataclass deriving from `Report`."""
from __future__ import annotations


class Report:
    """A command's finished result. Subclasses give `passed`, `verdict` and `to_dict`; `exit_code` is 0 when passed,
    else 1, unless the command knows better (verify's infrastructure failures are 3)."""

    @property
    def passed(self) -> bool:
        raise NotImplementedError

    @property
    def exit_code(self) -> int:
        return 0 if self.passed else 1

    @property
    def verdict(self) -> str:
        raise NotImplementedError

    def to_dict(self) -> dict:
        raise NotImplementedError
