"""Fixtures that start the real `inferx serve` on a free loopback port and always stop it.

The binary comes from $INFERX_BIN (default: build/cpu/src/cli/inferx in the repository); test data is read
in place from ../shared/testdata next to the repository.
"""
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
import requests

REPO = Path(__file__).resolve().parents[2]
TESTDATA = REPO.parent / "shared" / "testdata"
STORIES = TESTDATA / "stories260K.gguf"
CHAT_TEMPLATE = TESTDATA / "chat_templates" / "Qwen-Qwen3-0.6B.jinja"  # ChatML, no default system prompt


def inferx_bin() -> Path:
    return Path(os.environ.get("INFERX_BIN", REPO / "build" / "cpu" / "src" / "cli" / "inferx"))


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc: subprocess.Popen, port: int, log: Path, model: str):
        self.proc, self.port, self.log, self.model = proc, port, log, model
        self.url = f"http://127.0.0.1:{port}"

    def metrics(self) -> dict:
        """The /metrics samples without labels or with labels, as {'name{labels}': value}."""
        text = requests.get(self.url + "/metrics", timeout=10).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                out[name] = float(value)
        return out

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def run_server(tmp_path: Path, *args: str, model: str = str(STORIES), timeout: float = 60.0):
    binary = inferx_bin()
    if not binary.exists():
        pytest.fail(f"inferx binary not found at {binary} (build it, or set INFERX_BIN)")
    port = free_port()
    log = tmp_path / f"serve-{port}.log"
    cmd = [str(binary), "serve", "--model", model, "--host", "127.0.0.1", "--port", str(port), "--threads", "1",
           *args]
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT)
    server = Server(proc, port, log, model)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"inferx serve exited with {proc.returncode}:\n{server.log_text()}")
            try:
                if requests.get(server.url + "/ready", timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"inferx serve not ready after {timeout} s:\n{server.log_text()}")
            time.sleep(0.05)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)


@pytest.fixture(scope="session")
def stories_server(tmp_path_factory):
    """stories260K with a ChatML chat template (the model ships none)."""
    if not STORIES.exists():
        pytest.skip(f"{STORIES} missing")
    with run_server(tmp_path_factory.mktemp("srv"), "--chat-template", str(CHAT_TEMPLATE)) as s:
        yield s


@pytest.fixture(scope="session")
def client(stories_server):
    import openai

    return openai.OpenAI(base_url=stories_server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
