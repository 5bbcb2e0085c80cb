"""TF Serving's official image in a container (Docker, or Podman with the same command line), as TFX's
InfraValidator runs it: the model mounted read-only, ports published on loopback only, wait for GetModelStatus
AVAILABLE with a deadline, the container's log when loading fails, and the container removed whatever happens.

The image's entrypoint (tensorflow_serving/tools/docker/Dockerfile) runs
    tensorflow_model_server --port=8500 --rest_api_port=8501 \
        --model_name=${MODEL_NAME} --model_base_path=${MODEL_BASE_PATH}/${MODEL_NAME} "$@"
with MODEL_BASE_PATH=/models, so the version dir is mounted at /models/NAME/VERSION and extra flags are appended.

Every container carries the label LABEL=HOST:PID of the exportkit process that started it; a run finds the
containers of runs that were killed (their PID is gone) and removes them first.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
import socket
import subprocess
import sys

from exportkit.errors import CheckFailed, InfraError, UsageError
from exportkit.log import log
from exportkit.options.launch import LaunchOptions, batching_file
from exportkit.processes import pid_alive
from exportkit.savedmodel.versions import resolve_model_path
from exportkit.report.format import parse_size
from exportkit.serving.launch.binary import NO_LOAD_RETRIES, batching_flags
from exportkit.serving.launch.process import PendingServer, ServerHandle, flags_entry, free_port

IMAGE_REPO = "tensorflow/serving"
LABEL = "org.exportkit.run"
GRPC_PORT, REST_PORT = 8500, 8501
MODELS_DIR = "/models"
CONFIG_DIR = "/etc/exportkit"
CLI_TIMEOUT_S = 120.0
LOG_TAIL_LINES = 40


def is_container_mode(serving: str) -> bool:
    return serving == "docker" or serving.startswith("docker:")


def start_container(serving: str, path: str, model_name: str | None = None, device: str = "cpu",
                    load_timeout: float = 120.0, options: LaunchOptions | None = None) -> PendingServer:
    """TF Serving's image on the model in a container; `wait()` returns once the model is AVAILABLE."""
    options = options or LaunchOptions()
    image = image_for(serving, device)
    batching_file(options)
    cli = ContainerCli(options.container_cli)
    removed = remove_stale(cli)
    for stale in removed:
        log.warning(f"note: removed container {stale}, left behind by an exportkit run that was killed")
    image_id, digest = image_identity(cli, image, options.pull)
    loc = resolve_model_path(path)
    name = model_name or loc.default_name
    grpc_port, rest_port = free_port(), free_port()
    container = Container.run(cli, image, model_name=name, version_dir=str(loc.version_dir), version=loc.version,
                              grpc_port=grpc_port, rest_port=rest_port, gpu=device == "gpu",
                              batching_parameters=options.batching_parameters, server_args=options.server_flags.argv())
    address = f"127.0.0.1:{grpc_port}"
    what = f"TF Serving in {image} (container {container.name})"
    log_tail = f"container log (last {LOG_TAIL_LINES} lines)"

    def finish() -> ServerHandle:
        from exportkit.serving.client.grpc_client import ModelLoadFailed, ServingClient, ServingError

        def check() -> None:
            if not container.running():
                raise CheckFailed(f"{what} exited before the model was AVAILABLE; {log_tail}:\n{container.tail()}",
                                  "the container log says why TF Serving did not load the model")

        with ServingClient(address, name, loc.version) as client:
            try:
                client.wait_available(load_timeout, check=check)
            except ModelLoadFailed as err:
                raise CheckFailed(f"{what}: {err.message}\n{log_tail}:\n{container.tail()}",
                                  "the container log says why TF Serving did not load the model") from None
            except ServingError as err:
                hint = ("raise --load-timeout if the model is big" if err.code == "DEADLINE_EXCEEDED"
                        else "the container log says what went wrong")
                raise CheckFailed(f"{what}: {err}\n{log_tail}:\n{container.tail()}", hint) from None
        description = {"kind": "docker", "version": server_version(cli, image), "address": address,
                       "binary": None, "image": image, "image_id": image_id, "digest": digest,
                       "container": container.name, "cli": cli.name, "model_name": name,
                       "model_version": loc.version, **flags_entry(options.server_flags)}
        if removed:
            description["removed_stale"] = removed
        if moving_tag(image):
            print(f"warning: {image} moves with every TF Serving release; this run used TF Serving "
                  f"{description['version']} ({digest or image_id}): pin it with --serving "
                  f"docker:{description['version']}{'-gpu' if device == 'gpu' else ''} to run the same server again",
                  file=sys.stderr)
        return ServerHandle(address, description, name, loc.version, container.remove, None, container.tail,
                            rest_address=f"127.0.0.1:{rest_port}", memory=container.memory)

    return PendingServer(finish, container.remove)


def image_for(serving: str, device: str = "cpu") -> str:
    """`docker` -> tensorflow/serving:latest (latest-gpu with --device gpu); `docker:2.14.1` ->
    tensorflow/serving:2.14.1; `docker:NAME[:TAG]` with a `/` in it: that image, as given (a private build)."""
    tag = serving.partition(":")[2]
    if "/" in tag:
        return tag
    if not tag:
        tag = "latest-gpu" if device == "gpu" else "latest"
    if not re.fullmatch(r"[\w][\w.-]{0,127}", tag):
        raise UsageError(f"--serving {serving!r}: {tag!r} is not an image tag",
                         "pass --serving docker:2.14.1 (a tensorflow/serving tag) or docker:REGISTRY/IMAGE:TAG")
    if device == "gpu" and not tag.endswith("gpu"):
        raise UsageError(f"--device gpu with {IMAGE_REPO}:{tag}, which is a CPU-only build of TF Serving",
                         f"pass --serving docker:{tag}-gpu (the GPU image of the same release)")
    return f"{IMAGE_REPO}:{tag}"


def moving_tag(image: str) -> bool:
    """tensorflow/serving:latest[-gpu] (or no tag): a different server with every release."""
    tag = image.rpartition(":")[2] if ":" in image.rpartition("/")[2] else "latest"
    return tag in ("latest", "latest-gpu")


class ContainerCli:
    """The container command line (`docker` or `podman`): run one subcommand, errors as InfraError."""

    def __init__(self, cli: str = "docker"):
        found = shutil.which(cli)
        if found is None:
            raise InfraError(f"{cli} not found (--container-cli {cli}): no container runtime on this machine",
                             "install Docker or Podman (or pass --container-cli PATH), or use --serving embedded")
        self.name = os.path.basename(cli)
        self.path = found

    def run(self, *args: str, timeout: float = CLI_TIMEOUT_S, check: bool = True) -> subprocess.CompletedProcess:
        try:
            proc = subprocess.run([self.path, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            raise InfraError(f"`{self.name} {args[0]}` did not answer within {timeout:g}s",
                             f"check that the {self.name} daemon is running (`{self.name} info`)") from None
        except OSError as err:
            raise InfraError(f"cannot run {self.path}: {err}", "check --container-cli") from None
        if check and proc.returncode != 0:
            raise self.failure(args, proc)
        return proc

    def failure(self, args, proc: subprocess.CompletedProcess) -> InfraError:
        """A subcommand that failed for a reason of the runtime's own (no daemon, no permission on its socket)."""
        return InfraError(f"`{self.name} {' '.join(args[:2])}` failed: {_last_line(proc.stderr or proc.stdout)}",
                          f"check that the {self.name} daemon is running and that you may use it (`{self.name} info`)")


def _last_line(text: str) -> str:
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else "(no output)"


# How `image inspect` says an image is missing: Docker ("No such image"), Podman ("image not known", "failed to find
# image"). Anything else (the daemon not running, no permission on its socket) is not a missing image.
_MISSING_IMAGE = re.compile(r"no such image|image not known|failed to find image", re.IGNORECASE)


def image_identity(cli: ContainerCli, image: str, pull: bool) -> tuple[str, str | None]:
    """(image id, repo digest or None) of a local image; pulled first only with `pull`, else InfraError."""
    def inspect() -> subprocess.CompletedProcess:
        return cli.run("image", "inspect", "--format", '{{.Id}}|{{join .RepoDigests ","}}', image, check=False)

    proc = inspect()
    if proc.returncode != 0 and not _MISSING_IMAGE.search(proc.stderr + proc.stdout):  # no daemon, no permission
        raise cli.failure(("image", "inspect"), proc)
    if proc.returncode != 0 and pull:
        pulled = cli.run("pull", image, timeout=1800.0, check=False)
        if pulled.returncode != 0:
            raise InfraError(f"`{cli.name} pull {image}` failed: {_last_line(pulled.stderr or pulled.stdout)}",
                             "check the image name and tag (https://hub.docker.com/r/tensorflow/serving/tags) and "
                             "the network")
        proc = inspect()
    if proc.returncode != 0:
        raise InfraError(f"image {image} is not on this machine (exportkit pulls nothing unless asked)",
                         f"{cli.name} pull {image}   (or pass --pull)")
    image_id, _, digests = proc.stdout.strip().partition("|")
    return image_id, (digests.split(",")[0] or None) if digests else None


def image_of_version(cli: "ContainerCli", tf_version: str, device: str = "cpu") -> str:
    """TF Serving X.Y's image for `compat --serving docker` (TF Serving X.Y is built on TF X.Y): the newest
    tensorflow/serving:X.Y.Z[-gpu] on this machine, else X.Y.0 (whose absence then says what to pull)."""
    proc = cli.run("image", "ls", IMAGE_REPO, "--format", "{{.Tag}}", check=False)
    suffix = "-gpu" if device == "gpu" else ""
    pattern = re.compile(re.escape(tf_version) + r"\.(\d+)" + re.escape(suffix))
    patches = [int(m.group(1)) for tag in proc.stdout.split() if (m := pattern.fullmatch(tag))]
    return f"{IMAGE_REPO}:{tf_version}.{max(patches, default=0)}{suffix}"


def server_version(cli: ContainerCli, image: str) -> str:
    """The image's own answer to `tensorflow_model_server --version` ("2.14.1-rc0" ...), or "unknown"."""
    proc = cli.run("run", "--rm", "--network", "none", "--entrypoint", "tensorflow_model_server", image, "--version",
                   timeout=60.0, check=False)
    match = re.search(r"TensorFlow ModelServer:\s*(\S+)", proc.stdout + proc.stderr)
    return match.group(1) if match else "unknown"


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def remove_stale(cli: ContainerCli) -> list[str]:
    """Remove the containers that exportkit runs on this host left behind when they were killed; their names."""
    proc = cli.run("ps", "-a", "--filter", f"label={LABEL}", "--format", '{{.ID}} {{.Label "%s"}} {{.Names}}' % LABEL,
                   check=False)
    removed = []
    host = socket.gethostname()
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) < 3:
            continue
        container, owner, name = parts[0], parts[1], parts[2]
        owner_host, _, pid = owner.rpartition(":")
        if owner_host != host or not pid.isdigit() or pid_alive(int(pid)):
            continue  # another machine's, or a run still going
        cli.run("rm", "-f", container, check=False)
        removed.append(name)
    return removed


class Container:
    """One container of TF Serving: started detached, asked whether it still runs, its log tail, `remove()`."""

    def __init__(self, cli: ContainerCli, container_id: str, name: str):
        self.cli, self.id, self.name = cli, container_id, name

    @classmethod
    def run(cls, cli: ContainerCli, image: str, *, model_name: str, version_dir: str, version: int, grpc_port: int,
            rest_port: int, gpu: bool, batching_parameters: str | None, server_args: list[str] = ()) -> "Container":
        """Detached, labelled with this run, ports published on 127.0.0.1 only, the version dir read-only."""
        name = f"exportkit-{os.getpid()}-{secrets.token_hex(3)}"
        args = ["run", "-d", "--name", name, "--label", f"{LABEL}={_owner()}",
                "-p", f"127.0.0.1:{grpc_port}:{GRPC_PORT}", "-p", f"127.0.0.1:{rest_port}:{REST_PORT}",
                "-v", f"{os.path.abspath(version_dir)}:{MODELS_DIR}/{model_name}/{version}:ro",
                "-e", f"MODEL_NAME={model_name}"]
        if gpu:
            args += ["--gpus", "all"]
        inside = None
        if batching_parameters:
            inside = f"{CONFIG_DIR}/batching_parameters.txt"
            args += ["-v", f"{os.path.abspath(batching_parameters)}:{inside}:ro"]
        try:
            proc = cli.run(*args, image, *NO_LOAD_RETRIES, *batching_flags(inside), *server_args, check=False)
        except BaseException:  # interrupted while `run` was creating it: remove it by the name we gave it
            cli.run("rm", "-f", name, check=False)
            raise
        if proc.returncode != 0:
            cli.run("rm", "-f", name, check=False)  # created but not started: nothing may stay behind
            raise InfraError(f"`{cli.name} run {image}` failed: {_last_line(proc.stderr or proc.stdout)}",
                             f"check that {cli.name} can start containers (`{cli.name} run --rm {image} --version`)")
        return cls(cli, proc.stdout.strip().splitlines()[-1], name)

    def running(self) -> bool:
        proc = self.cli.run("ps", "-q", "--filter", f"id={self.id}", check=False)
        return bool(proc.stdout.strip())

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        if self.id is None:
            return ""
        proc = self.cli.run("logs", "--tail", str(lines), self.id, check=False)
        return "\n".join((proc.stdout + proc.stderr).splitlines()[-lines:])

    def memory(self) -> dict:
        """The container's memory as its runtime accounts it (`docker stats`: the cgroup's usage, e.g. `512.3MiB /
        7.6GiB`; podman prints decimal `MB`): {"total_bytes", "method"}, {} when it cannot say."""
        if self.id is None:
            return {}
        proc = self.cli.run("stats", "--no-stream", "--format", "{{.MemUsage}}", self.id, check=False)
        used = parse_size(proc.stdout.strip().split("/")[0].strip()) if proc.returncode == 0 and proc.stdout else None
        return {"total_bytes": used, "method": f"{self.cli.name} stats (the container's cgroup)"} if used else {}

    def remove(self) -> None:
        """Idempotent: from finally, atexit, Ctrl-C and SIGTERM alike."""
        if self.id is not None:
            container, self.id = self.id, None
            self.cli.run("rm", "-f", container, timeout=60.0, check=False)
