#!/usr/bin/env python3
"""deploy/Dockerfile for real: builds its CPU variant with podman, runs it, sends it requests.

Usage: container_test.py SOURCE_DIR CACHE_DIR   (ctest container_test, label slow)

1. Base image: Debian 12 (bookworm) made here, since no registry is reachable: debootstrap
   --variant=minbase, tarred once to CACHE_DIR/debian-bookworm.tar (later runs reuse it), and
   `podman import`ed as localhost/specd-debian:bookworm when podman's store lacks it.
2. `podman build --isolation=chroot` of deploy/Dockerfile with that base as BUILDER_IMAGE and
   RUNTIME_IMAGE and SPECD_ENABLE_CUDA=OFF; CACHE_DIR/ccache is mounted as the compiler cache,
   so a rebuild after a source change recompiles only what changed (`--format docker` keeps
   the HEALTHCHECK, which OCI image configs cannot hold).
3. Runs the image with its own ENTRYPOINT and CMD, in its own network namespace (nothing can
   clash with port 8000 on the host), and checks through the image's curl (`podman exec`):
   /health, the HEALTHCHECK as written (`podman healthcheck run`), /ready, a greedy completion
   on the bundled codepair model equal to its golden text (models/codepair/golden.json, made
   with HF transformers), that the server process runs as uid/gid 10001 (read on the host from
   /proc/PID/status), and that SIGTERM (`podman stop`) drains it to exit 0.

Needs root (re-runs itself with `sudo -n` when that works), podman, runc and debootstrap
(tools/install_deps.sh); without them the test is skipped (exit 77), or fails under CI=true
(tests/requires.py). Prints the time of each phase.
"""
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

sys.dont_write_bytecode = True  # importing sibling scripts leaves no __pycache__
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import requires  # noqa: E402

BASE_IMAGE = "localhost/specd-debian:bookworm"
IMAGE = "localhost/specd:container-test"
MIRROR = os.environ.get("SPECD_DEBIAN_MIRROR", "http://deb.debian.org/debian")
UID = "10001"
# podman on runc with cgroupfs (no systemd here). Its default rlimits (nofile 1048576 ...)
# exceed what an unprivileged sandbox may set, so the container gets the host's own limits.
PODMAN = ["podman", "--runtime", "runc", "--cgroup-manager", "cgroupfs"]


def log(message):
    print(f"container_test: {message}", flush=True)


def run(cmd, timeout=600, check=True, **kw):
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    if check and p.returncode != 0:
        sys.exit(f"container_test: {' '.join(cmd)} exited {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def ulimits():
    import resource
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 32768)
    return ["--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}"]


def base_image(cache):
    """Imports the cached Debian tarball (made with debootstrap on first use) into podman."""
    tar = os.path.join(cache, "debian-bookworm.tar")
    if not os.path.exists(tar):
        start = time.monotonic()
        with tempfile.TemporaryDirectory(dir=cache) as tmp:
            root = os.path.join(tmp, "rootfs")
            run(["debootstrap", "--variant=minbase", "bookworm", root, MIRROR], timeout=1800)
            run(["tar", "--numeric-owner", "-C", root, "-cf", tar + ".part", "."], timeout=600)
            os.replace(tar + ".part", tar)
        log(f"debootstrap bookworm: {time.monotonic() - start:.0f} s")
    if run(PODMAN + ["image", "exists", BASE_IMAGE], check=False).returncode != 0:
        start = time.monotonic()
        run(PODMAN + ["import", tar, BASE_IMAGE], timeout=600)
        log(f"podman import: {time.monotonic() - start:.0f} s")


def build_image(source, cache):
    ccache = os.path.join(cache, "ccache")
    os.makedirs(ccache, exist_ok=True)
    cmd = PODMAN + [
        "build", "--isolation=chroot", "--format", "docker", "--layers",
        "-f", os.path.join(source, "deploy", "Dockerfile"),
        "--ignorefile", os.path.join(source, "deploy", "Dockerfile.dockerignore"),
        "--build-arg", f"BUILDER_IMAGE={BASE_IMAGE}", "--build-arg", f"RUNTIME_IMAGE={BASE_IMAGE}",
        "--build-arg", "SPECD_ENABLE_CUDA=OFF", "--build-arg", "CCACHE_DIR=/ccache",
        "--build-arg", f"BUILD_JOBS={os.environ.get('SPECD_CONTAINER_JOBS', '')}",
        "-v", f"{ccache}:/ccache", "-t", IMAGE, source]
    start = time.monotonic()
    with open(os.path.join(cache, "build.log"), "w") as out:
        p = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=5400)
    if p.returncode != 0:
        with open(os.path.join(cache, "build.log")) as f:
            tail = f.readlines()[-80:]
        sys.exit(f"container_test: podman build exited {p.returncode}:\n{''.join(tail)}")
    stats = run(["ccache", "-d", ccache, "-s"], check=False).stdout if os.path.exists(
        "/usr/bin/ccache") else ""
    log(f"podman build: {time.monotonic() - start:.0f} s")
    for line in stats.splitlines():
        if "Hits" in line or "Misses" in line or "hit rate" in line:
            log(f"ccache {line.strip()}")


class Container:
    def __init__(self):
        self.name = f"specd-container-test-{os.getpid()}"

    def __enter__(self):
        run(PODMAN + ["run", "-d", "--name", self.name, "--network=none",
                      "--health-interval=disable", *ulimits(), IMAGE])
        return self

    def __exit__(self, *exc):
        run(PODMAN + ["rm", "-f", "-t", "0", self.name], check=False)

    def curl(self, path, body=None):
        """(status, body text) of a request sent from inside the container."""
        cmd = PODMAN + ["exec", "-i", self.name, "curl", "-sS",
                        "-w", "\n%{http_code}", "--max-time", "60"]
        if body is not None:
            cmd += ["-H", "Content-Type: application/json", "--data-binary", "@-"]
        p = run(cmd + [f"http://127.0.0.1:8000{path}"], check=False,
                input=json.dumps(body) if body is not None else "")
        text, _, status = p.stdout.rpartition("\n")
        return (int(status) if status.isdigit() else 0), text

    def logs(self):
        return run(PODMAN + ["logs", self.name], check=False).stderr

    def inspect(self, fmt):
        return run(PODMAN + ["inspect", "--format", fmt, self.name]).stdout.strip()


def fail(container, message):
    sys.exit(f"container_test: FAIL: {message}\n--- container log ---\n{container.logs()}")


def check_serving(source, c):
    start = time.monotonic()
    while True:
        status, _ = c.curl("/health")
        if status == 200:
            break
        if c.inspect("{{.State.Running}}") != "true" or time.monotonic() - start > 180:
            fail(c, f"/health never answered 200 (last {status})")
        time.sleep(0.5)
    log(f"/health 200 after {time.monotonic() - start:.1f} s")
    p = run(PODMAN + ["healthcheck", "run", c.name], check=False)
    if p.returncode != 0:
        fail(c, f"HEALTHCHECK failed: {p.stdout}{p.stderr}")
    log("HEALTHCHECK (podman healthcheck run): healthy")
    status, text = c.curl("/ready")
    if status != 200:
        fail(c, f"/ready: {status} {text}")

    with open(os.path.join(source, "models", "codepair", "golden.json"), encoding="utf-8") as f:
        golden = json.load(f)["target"][0]
    body = {"model": "codepair", "prompt": golden["prompt_ids"], "temperature": 0,
            "max_tokens": len(golden["greedy_ids"]), "ignore_eos": True}
    status, text = c.curl("/v1/completions", body)
    if status != 200:
        fail(c, f"completion: {status} {text}")
    choice = json.loads(text)["choices"][0]
    if not choice["text"] or choice["text"] != golden["greedy_text"]:
        fail(c, f"completion text {choice['text']!r} != golden {golden['greedy_text']!r}")
    log(f"completion equals the golden ({len(golden['greedy_ids'])} tokens)")


def check_user(c):
    pid = c.inspect("{{.State.Pid}}")
    with open(f"/proc/{pid}/status", encoding="utf-8") as f:
        fields = dict(line.split(":", 1) for line in f if ":" in line)
    name = fields["Name"].strip()
    uids, gids = fields["Uid"].split(), fields["Gid"].split()
    if name != "specd" or set(uids) != {UID} or set(gids) != {UID}:
        fail(c, f"process {pid} is {name!r} with uids {uids} gids {gids}, want specd as {UID}")
    if c.inspect("{{.Config.User}}") != f"{UID}:{UID}":
        fail(c, f"image USER is {c.inspect('{{.Config.User}}')!r}")
    log(f"server process {pid} ({name}) runs as uid/gid {UID}")


def main():
    source, cache = (os.path.abspath(a) for a in sys.argv[1:3])
    if os.geteuid() != 0:  # rootful podman and debootstrap: run as root, through sudo if allowed
        if shutil.which("sudo") and subprocess.run(["sudo", "-n", "true"]).returncode == 0:
            os.execvp("sudo", ["sudo", "-n", "-E", sys.executable, *sys.argv])
        requires.missing("container_test", "root (rootful podman, debootstrap)",
                         "run as root or with password-less sudo")
    requires.programs("container_test", "podman", "runc", "debootstrap", "tar")
    os.makedirs(cache, exist_ok=True)
    total = time.monotonic()
    with open(os.path.join(cache, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time per cache
        base_image(cache)
        build_image(source, cache)
        with Container() as c:
            check_serving(source, c)
            check_user(c)
            start = time.monotonic()
            run(PODMAN + ["stop", "-t", "60", c.name], timeout=120)
            code = c.inspect("{{.State.ExitCode}}")
            if code != "0":
                fail(c, f"exit code {code} after SIGTERM")
            log(f"SIGTERM: exit 0 after {time.monotonic() - start:.1f} s")
    log(f"PASS in {time.monotonic() - total:.0f} s")


if __name__ == "__main__":
    main()
