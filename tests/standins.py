"""Stand-ins for what these machines lack: a `docker` CLI and a `tensorflow_model_server` binary.

Only the container runtime and the binary's packaging stand in: the server inside is `exportkit serve`, started with
the very flags TF Serving's image entrypoint passes (tensorflow_serving/tools/docker/Dockerfile), so the gRPC and REST
protocol the tests see is real. The `docker` stand-in implements the subcommands exportkit calls: `run` (detached,
and `--rm --entrypoint tensorflow_model_server IMAGE --version`), `ps`, `logs`, `rm`, `image inspect|ls`, `pull`,
`stats` (the container's process's RSS).

State lives in $EXPORTKIT_STANDIN_STATE: `images.json` ({image: digest}: what is "pulled"), `registry.json` (what
`pull` can fetch), and one `containers/ID.json` per container. A container's "filesystem" is a directory of
symlinks, one per `-v` mount, so container paths map to host paths.
"""
from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

STATE_ENV = "EXPORTKIT_STANDIN_STATE"
DAEMON_ENV = "EXPORTKIT_STANDIN_DAEMON"  # the socket of a ContainerDaemon: containers start as its forks
VERSION = "2.14.1-standin"

_DOCKER = r'''
import hashlib, json, os, re, signal, socket, subprocess, sys, time
from pathlib import Path

STATE = Path(os.environ["%(state_env)s"])
CONTAINERS = STATE / "containers"
CONTAINERS.mkdir(parents=True, exist_ok=True)
ENTRYPOINT = ["--port=8500", "--rest_api_port=8501", "--model_name={MODEL_NAME}",
              "--model_base_path={MODEL_BASE_PATH}/{MODEL_NAME}"]


def load(path, default):
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return default


def images():
    return load(STATE / "images.json", {})


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is not running
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"
    except OSError:
        return False


def records():
    for path in sorted(CONTAINERS.glob("*.json")):
        rec = load(path, None)
        if rec:
            rec["running"] = alive(rec["pid"])
            yield rec


def find(ref):
    for rec in records():
        if rec["id"].startswith(ref) or rec["name"] == ref:
            return rec
    return None


def fmt(template, rec):
    out = template.replace("{{.ID}}", rec["id"][:12]).replace("{{.Names}}", rec["name"])
    return re.sub(r'\{\{\.Label "([^"]+)"\}\}', lambda m: rec["labels"].get(m.group(1), ""), out)


def cmd_run(args):
    opts = {"-v": [], "-p": [], "-e": [], "--label": [], "--name": None, "--entrypoint": None}
    detach = remove = False
    while args and args[0].startswith("-"):
        flag = args.pop(0)
        if flag == "-d":
            detach = True
        elif flag == "--rm":
            remove = True
        elif flag in ("--gpus", "--network"):
            args.pop(0)
        elif flag in opts:
            value = args.pop(0)
            if isinstance(opts[flag], list):
                opts[flag].append(value)
            else:
                opts[flag] = value
        else:
            sys.exit(f"docker: unknown flag: {flag}")
    image, rest = args[0], args[1:]
    if image not in images():
        print(f"Unable to find image '{image}' locally", file=sys.stderr)
        sys.exit(125)
    if opts["--entrypoint"] == "tensorflow_model_server" and rest == ["--version"]:
        print("TensorFlow ModelServer: %(version)s\nTensorFlow Library: standin")
        return
    if not detach:
        sys.exit("docker stand-in: only `run -d` and `run --rm --entrypoint tensorflow_model_server IMAGE --version`")
    cid = hashlib.sha256(f"{time.time()}{os.getpid()}".encode()).hexdigest()
    name = opts["--name"] or f"standin_{cid[:6]}"
    if any(r["name"] == name for r in records()):
        print(f"Conflict. The container name \"/{name}\" is already in use", file=sys.stderr)
        sys.exit(125)
    root = CONTAINERS / f"{cid}.root"
    for mount in opts["-v"]:
        src, dst = mount.split(":")[:2]
        target = root / dst.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.abspath(src), target)
    env = {"MODEL_BASE_PATH": "/models", "MODEL_NAME": "model"}
    env.update(e.split("=", 1) for e in opts["-e"])
    ports = {}
    for publish in opts["-p"]:
        host, _, inner = publish.rpartition(":")
        assert host.startswith("127.0.0.1:"), f"stand-in publishes on loopback only, got {publish}"
        ports[inner] = host.split(":")[1]

    def host_path(value):
        return str(root / value.lstrip("/")) if value.startswith("/") else value

    argv = []
    for flag in [a.format(**env) for a in ENTRYPOINT] + rest:
        key, sep, value = flag.partition("=")
        if key in ("--port", "--rest_api_port"):
            value = ports.get(value, "0")
        elif sep and value.startswith("/"):
            value = host_path(value)
        argv.append(f"{key}{sep}{value}")
    log = CONTAINERS / f"{cid}.log"
    daemon = os.environ.get("%(daemon_env)s")
    if daemon:  # the containers' parent is the daemon, as dockerd's (containerd's) are: see ContainerDaemon
        with socket.socket(socket.AF_UNIX) as conn:
            conn.connect(daemon)
            conn.sendall(json.dumps({"argv": argv, "log": str(log), "cwd": str(CONTAINERS),
                                     "env": dict(os.environ)}).encode() + b"\n")
            pid = json.loads(conn.makefile().readline())["pid"]
    else:
        with open(log, "wb") as out:
            pid = subprocess.Popen([%(python)r, "-m", "exportkit", "serve", *argv], stdin=subprocess.DEVNULL,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                   cwd=str(CONTAINERS)).pid
    labels = dict(label.split("=", 1) for label in opts["--label"])
    record = CONTAINERS / f"{cid}.json.partial"  # renamed whole: a reader (a test polling) never sees half of it
    record.write_text(json.dumps({"id": cid, "name": name, "image": image, "labels": labels, "pid": pid,
                                  "argv": argv, "log": str(log), "remove": remove}))
    os.replace(record, CONTAINERS / f"{cid}.json")
    print(cid)


def cmd_ps(args):
    show_all = "-a" in args
    quiet = "-q" in args
    filters, template = [], "{{.ID}} {{.Names}}"
    for i, a in enumerate(args):
        if a == "--filter":
            filters.append(args[i + 1])
        elif a == "--format":
            template = args[i + 1]
    for rec in records():
        if not show_all and not rec["running"]:
            continue
        ok = True
        for f in filters:
            key, _, value = f.partition("=")
            if key == "id":
                ok &= rec["id"].startswith(value)
            elif key == "name":
                ok &= value in rec["name"]
            elif key == "label":
                lk, _, lv = value.partition("=")
                ok &= lk in rec["labels"] and (not lv or rec["labels"][lk] == lv)
        if ok:
            print(rec["id"][:12] if quiet else fmt(template, rec))


def cmd_stats(args):
    """`stats --no-stream --format {{.MemUsage}} ID`: the container's process's RSS (/proc), as docker prints a
    cgroup's usage (binary units, `512.3MiB / 7.6GiB`)."""
    rec = find(args[-1])
    if rec is None or not rec["running"]:
        sys.exit(f"Error: No such container: {args[-1]}")
    with open(f"/proc/{rec['pid']}/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    print(f"{rss / 2**20:.2f}MiB / 7.6GiB")


def cmd_logs(args):
    tail = None
    if args[0] == "--tail":
        tail, args = int(args[1]), args[2:]
    rec = find(args[0])
    if rec is None:
        sys.exit(f"Error: No such container: {args[0]}")
    lines = Path(rec["log"]).read_text(errors="replace").splitlines()
    print("\n".join(lines[-tail:] if tail else lines))


def cmd_rm(args):
    code = 0
    for ref in [a for a in args if not a.startswith("-")]:
        rec = find(ref)
        if rec is None:
            print(f"Error: No such container: {ref}", file=sys.stderr)
            code = 1
            continue
        if rec["running"]:
            if "-f" not in args:
                sys.exit(f"Error: container {ref} is running: stop it or use -f")
            try:
                os.killpg(rec["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass
            for _ in range(100):
                if not alive(rec["pid"]):
                    break
                time.sleep(0.05)
        for suffix in (".json", ".log"):
            (CONTAINERS / f"{rec['id']}{suffix}").unlink(missing_ok=True)
        root = CONTAINERS / f"{rec['id']}.root"
        if root.exists():
            subprocess.run(["rm", "-rf", str(root)])
        print(ref)
    sys.exit(code)


def cmd_image(args):
    if args[0] == "ls":  # image ls REPO --format {{.Tag}}
        for image in images():
            repo, _, tag = image.rpartition(":")
            if repo == args[1]:
                print(tag)
        return
    if args[0] != "inspect":
        sys.exit("docker stand-in: only `image inspect` and `image ls`")
    image = args[-1]
    digest = images().get(image)
    if digest is None:
        print(f"Error: No such image: {image}", file=sys.stderr)
        sys.exit(1)
    template = args[args.index("--format") + 1] if "--format" in args else "{{.Id}}"
    repo = image.rpartition(":")[0]
    print(template.replace("{{.Id}}", "sha256:" + digest[::-1]).replace('{{join .RepoDigests ","}}',
                                                                          f"{repo}@sha256:{digest}"))


def cmd_pull(args):
    image = args[-1]
    registry = load(STATE / "registry.json", {})
    if image not in registry:
        print(f"Error response from daemon: manifest for {image} not found", file=sys.stderr)
        sys.exit(1)
    known = images()
    known[image] = registry[image]
    (STATE / "images.json").write_text(json.dumps(known))
    print(f"Status: Downloaded newer image for {image}")


with open(STATE / "calls.log", "a") as calls:
    calls.write(json.dumps(sys.argv[1:]) + "\n")
command, rest = sys.argv[1], sys.argv[2:]
{"run": cmd_run, "ps": cmd_ps, "logs": cmd_logs, "rm": cmd_rm, "image": cmd_image, "pull": cmd_pull,
 "stats": cmd_stats}[command](rest)
'''

_BINARY = r'''
import os, sys
if "--version" in sys.argv[1:]:
    print("TensorFlow ModelServer: %(version)s\nTensorFlow Library: standin")
    sys.exit(0)
os.execv(%(python)r, [%(python)r, "-m", "exportkit", "serve", *sys.argv[1:]])
'''


def _write(path: Path, body: str) -> Path:
    path.write_text(f"#!{sys.executable}\n" + body % {"python": sys.executable, "state_env": STATE_ENV, "daemon_env": DAEMON_ENV,
                                                     "version": VERSION})
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def write_docker(bin_dir: Path, state: Path, images: dict[str, str], registry: dict[str, str] | None = None) -> Path:
    """A `docker` executable in bin_dir whose state is `state`; `images` are "pulled", `registry` can be pulled."""
    state.mkdir(parents=True, exist_ok=True)
    (state / "images.json").write_text(json.dumps(images))
    (state / "registry.json").write_text(json.dumps(registry or {}))
    return _write(bin_dir / "docker", _DOCKER)


def write_binary(bin_dir: Path) -> Path:
    """A `tensorflow_model_server` executable in bin_dir: `exportkit serve` with the arguments it is given."""
    return _write(bin_dir / "tensorflow_model_server", _BINARY)


def containers(state: Path) -> list[dict]:
    """The stand-in's containers (running or not)."""
    return [json.loads(p.read_text()) for p in sorted((state / "containers").glob("*.json"))]


def calls(state: Path) -> list[list[str]]:
    """Every command line the stand-in was called with, in order."""
    path = state / "calls.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def env_with(bin_dir: Path, state: Path, daemon: "ContainerDaemon | None" = None) -> dict:
    env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", STATE_ENV: str(state)}
    return env | ({DAEMON_ENV: daemon.socket_path} if daemon else {})


class ContainerDaemon:
    """dockerd's part: the process the stand-in's containers are children of. It imports TensorFlow and the CLI
    once (as exportkit's own fork server does, before any TensorFlow context exists) and forks each container's
    `exportkit serve` from that: ~0.5 s a container instead of a 3 s import. Each fork gets its own session, log,
    directory and the environment of the `docker run` that asked for it. The server inside is unchanged."""

    def __init__(self, directory: Path):
        self.socket_path = str(directory / "daemon.sock")
        self.process = subprocess.Popen([sys.executable, "-c", _DAEMON, self.socket_path], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, start_new_session=True)
        assert self.process.stdout.readline().strip() == "ready", "the container daemon did not start"

    def close(self) -> None:
        self.process.stdin.close()  # its EOF: it stops accepting and exits
        self.process.wait(timeout=30)
        self.process.stdout.close()


_DAEMON = r'''
import json, os, signal, socket, sys, threading
from exportkit.runtimes import session_worker
session_worker.prepare()  # TensorFlow imported, nothing of it initialised: what makes the fork safe
import exportkit.cli, exportkit.entry, exportkit.serving.server.model_server

def reap(*_):
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return

signal.signal(signal.SIGCHLD, reap)
listener = socket.socket(socket.AF_UNIX)
listener.bind(sys.argv[1])
listener.listen()
threading.Thread(target=lambda: (sys.stdin.read(), os._exit(0)), daemon=True).start()
print("ready", flush=True)
while True:
    try:
        conn, _ = listener.accept()
    except InterruptedError:
        continue
    request = json.loads(conn.makefile().readline())
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            listener.close()
            conn.close()
            log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
            os.dup2(log, 1)
            os.dup2(log, 2)
            os.chdir(request["cwd"])
            os.environ.clear()
            os.environ.update(request["env"])
            sys.argv = ["exportkit", "serve", *request["argv"]]
            exportkit.entry.main()
            code = 0
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code)
    conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
    conn.close()
'''
