"""One exception family. Each kind maps to one exit code and carries the fix."""
from __future__ import annotations

EXIT_OK = 0
EXIT_CHECK_FAILED = 1
EXIT_USAGE = 2
EXIT_INFRA = 3


class ExportkitError(Exception):
    """An error the user can act on: `message` says what is wrong, `remedy` how to fix it."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, remedy: str | None = None):
        super().__init__(message)
        self.message = message
        self.remedy = remedy

    @property
    def fix(self) -> str | None:
        """The `fix:` line (the Python API's name for the remedy)."""
        return self.remedy

    def __str__(self) -> str:
        return f"{self.message}: {self.remedy}" if self.remedy else self.message


class UsageError(ExportkitError):
    """Bad usage or bad input: no such file, not a model, missing custom object, misfit checkpoint."""

    exit_code = EXIT_USAGE


class CheckFailed(ExportkitError):
    """The model fails a check (mismatch, a runtime cannot load or run it)."""

    exit_code = EXIT_CHECK_FAILED


class InfraError(ExportkitError):
    """The environment failed: no GPU, no server binary, a worker process died."""

    exit_code = EXIT_INFRA


# Import names of exportkit's dependencies that differ from the name pip installs them by (pyproject.toml).
_DISTRIBUTIONS = {"grpc": "grpcio", "tensorflow_serving": "tensorflow-serving-api", "rapidjson": "python-rapidjson",
                  "yaml": "PyYAML"}


class MissingModule(InfraError):
    """A Python (the CLI's, a worker's, a managed environment's) lacks a module exportkit needs: the environment's
    fault, never the model's (exit 3), with the pip command that installs it."""

    def __init__(self, module: str, python: str):
        top = module.split(".")[0]
        self.module, self.package = module, _DISTRIBUTIONS.get(top, top)
        super().__init__(f"{python} has no module '{module}' (the package {self.package}): exportkit needs it",
                         f"install it into that environment: `{python} -m pip install {self.package}`")
