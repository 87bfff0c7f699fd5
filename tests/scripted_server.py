"""A scripted OpenAI-compatible HTTP server for tests: it replays a list of replies over real
HTTP so the real `openai` client is exercised end to end (streaming and not, tool calls, usage),
and injects the failures real endpoints produce (429, 500, slow replies, malformed bodies).

Script entries, consumed one per chat-completion request:
    "text"                                  an assistant message
    {"content": str, "tool_calls": [{"name": str, "arguments": dict | str, "id": str?}],
     "finish_reason": str?, "usage": {"prompt_tokens": int, "completion_tokens": int}?}
    {"error": 429 | 500 | ..., "retry_after": float?, "message": str?}
    {"delay": seconds, ...}                 sleep first (a slow reply), then answer the rest
    {"chunk_delay": seconds, ...}           a slow but working server: that long between streamed
                                            chunks (not streamed: that long per chunk, then the body)
    {"chunk_size": int, ...}                characters of content per streamed chunk (default 7)
    {"stall_after": n, "stall_s": seconds?} stream n chunks, then send nothing for stall_s (3 s)
                                            and close the connection without finishing the reply
    {"stream_error_after": n, "message"?}   stream n chunks, then an SSE error event
    {"ping_every": seconds, "for_s"?: s}   streamed: 200, then only SSE comments (`: ping`) that
                                            often, for for_s (600 s), as a server queued behind
                                            an earlier request keeps the stream alive
    {"headers_only": seconds}               200 and its headers (streamed or not), then nothing for
                                            that long, then the connection closes
    {"reasoning": str, ...}                 the thinking, apart (`reasoning_content`, as vLLM does)
    {"malformed": true}                     200 with a body that is not JSON (or a broken SSE chunk)
    {"drop": "eof" | "chunked" | "no_response"}
                                            streamed: 200, then the connection closed before any
                                            chunk, cleanly or mid chunked body; or closed with no
                                            response at all (llama-cpp-python's server reports an
                                            error in a streamed request these ways)
    callable(request_body) -> entry         answer from what the agent sent (e.g. an observation)

`reject_images="openai" | "vllm" | "ollama" | "llama-server" | "llama-cpp-python"`: a request
whose messages hold an `image_url` part is refused as that server refuses it for a model without
image input (status and body below, IMAGE_REFUSALS); the request is recorded, no entry used.
`image_parts(body)` counts them in a recorded request.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from tests.cli_runner import free_port

Entry = str | dict | Callable[[dict], Any]

# How real servers refuse image parts for a model that takes none: (status, body).
IMAGE_REFUSALS: dict[str, tuple[int, dict]] = {
    "openai": (400, {"error": {
        "message": "Invalid content type. image_url is only supported by certain models.",
        "type": "invalid_request_error", "param": "messages.[3].content.[1].type", "code": None,
    }}),
    # vLLM serving a text-only model (its error object is not wrapped in "error")
    "vllm": (400, {"object": "error", "message": "Qwen/Qwen3-8B is not a multimodal model None",
                   "type": "BadRequestError", "param": None, "code": 400}),
    "ollama": (500, {"error": {"message": "Failed to create new sequence: failed to process "
                               "inputs: this model is missing data required for image input",
                               "type": "api_error", "param": None, "code": None}}),
    "llama-server": (500, {"error": {"code": 500, "type": "server_error", "message": (
        "image input is not supported - hint: if this is unexpected, you may need to "
        "provide the mmproj")}}),
    # llama-cpp-python puts the data URL into the prompt as text (measured with SmolLM2)
    "llama-cpp-python": (400, {"error": {
        "message": "This model's maximum context length is 8192 tokens. However, you requested "
        "97243 tokens (97238 in the messages, 5 in the completion). Please reduce the length "
        "of the messages or completion.",
        "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded",
    }}),
}  # fmt: skip


def image_parts(body: dict) -> int:
    """The image_url parts of a chat-completion request."""
    return sum(
        1
        for m in body.get("messages", [])
        if isinstance(m.get("content"), list)
        for p in m["content"]
        if p.get("type") == "image_url"
    )


def dead_url() -> str:
    """An endpoint URL on a local port nothing listens on."""
    return f"http://127.0.0.1:{free_port()}/v1"


class ScriptedServer:
    def __init__(
        self,
        script: list[Entry] | None = None,
        *,
        api_key: str | None = None,
        reject_tools: bool = False,
        honor_stop: bool = True,
        reject_params: tuple[str, ...] = (),
        model: str = "scripted-model",
        stream_usage: bool = True,
        reject_images: str | None = None,
    ):
        self.script: list[Entry] = list(script or [])
        self.api_key, self.reject_tools, self.honor_stop, self.model = (
            api_key,
            reject_tools,
            honor_stop,
            model,
        )
        # request fields answered with a 400: "max_tokens" as OpenAI's o-series and gpt-5
        # models do, "stream_options" as older vLLM and other strict servers do
        self.reject_params = reject_params
        # False: stream_options is accepted but no usage is streamed, as llama-cpp-python does
        self.stream_usage = stream_usage
        self.reject_images = reject_images  # a key of IMAGE_REFUSALS
        self.requests: list[dict] = []  # every chat-completion body received, in order
        self.served = 0
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def add(self, *entries: Entry) -> None:
        with self._lock:
            self.script.extend(entries)

    def left(self) -> int:
        with self._lock:
            return len(self.script)

    def _next(self, body: dict) -> dict:
        with self._lock:
            self.requests.append(body)
            if not self.script:
                return {
                    "error": 400,
                    "message": f"scripted server: script exhausted after {self.served} replies",
                }
            entry = self.script.pop(0)
            self.served += 1
        if callable(entry):
            entry = entry(body)
        return {"content": entry} if isinstance(entry, str) else dict(entry)


def _handler(server: ScriptedServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:  # keep pytest output clean
            pass

        def handle(self) -> None:
            try:
                super().handle()
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up (a timeout test): nothing to answer

        def do_GET(self) -> None:
            if server.api_key and self.headers.get("authorization") != f"Bearer {server.api_key}":
                self._json(401, _error("Incorrect API key provided", "invalid_api_key"))
            elif self.path.rstrip("/").endswith("/models"):
                self._json(
                    200, {"object": "list", "data": [{"id": server.model, "object": "model"}]}
                )
            else:
                self._json(404, _error(f"no route {self.path}", "not_found"))

        def do_POST(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            raw = self.rfile.read(length)
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._json(404, _error(f"no route {self.path}", "not_found"))
                return
            if server.api_key and self.headers.get("authorization") != f"Bearer {server.api_key}":
                self._json(401, _error("Incorrect API key provided", "invalid_api_key"))
                return
            body = json.loads(raw)
            if server.reject_tools and body.get("tools"):
                server.requests.append(body)
                self._json(
                    400,
                    _error(f"registry/{server.model} does not support tools", "invalid_request"),
                )
                return
            if server.reject_images and image_parts(body):
                with server._lock:
                    server.requests.append(body)
                status, error = IMAGE_REFUSALS[server.reject_images]
                self._json(status, error)
                return
            refused = [p for p in server.reject_params if p in body]
            if refused:
                server.requests.append(body)
                message = f"Unrecognized request argument supplied: {refused[0]}"
                if refused[0] == "max_tokens":
                    message = (
                        "Unsupported parameter: 'max_tokens' is not supported with this model. "
                        "Use 'max_completion_tokens' instead."
                    )
                self._json(400, _error(message, "unsupported_parameter"))
                return
            entry = server._next(body)
            if entry.get("delay"):
                time.sleep(entry.pop("delay"))
            if "error" in entry:
                headers = {}
                if entry.get("retry_after") is not None:
                    headers["retry-after"] = str(entry["retry_after"])
                status = int(entry["error"])
                message = entry.get("message", f"scripted error {status}")  # "" stays empty
                self._json(status, _error(message, str(status)), headers)
                return
            if entry.get("headers_only") or entry.get("ping_every"):
                self._withhold(entry, bool(body.get("stream")))
            elif body.get("stream"):
                self._stream(body, entry)
            else:
                self._complete(body, entry)

        def _complete(self, body: dict, entry: dict) -> None:
            if entry.get("malformed"):
                self._send(200, b'{"id": "x", "choices": [ this is not json', "application/json")
                return
            content, calls, finish, usage = _reply(server, body, entry)
            if entry.get("chunk_delay"):  # generating the whole reply first
                time.sleep(entry["chunk_delay"] * len(_pieces(entry, content, calls)))
            message: dict = {
                "role": "assistant",
                "content": content if content or not calls else None,
            }
            if entry.get("reasoning"):
                message["reasoning_content"] = entry["reasoning"]
            if calls:
                message["tool_calls"] = calls
            self._json(
                200,
                {
                    "id": f"chatcmpl-{server.served}",
                    "object": "chat.completion",
                    "created": int(time.time()),
                    "model": body.get("model", server.model),
                    "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                    "usage": usage,
                },
            )

        def _stream(self, body: dict, entry: dict) -> None:
            if entry.get("drop") == "no_response":
                self.close_connection = True
                return
            self.send_response(200)
            self.send_header("content-type", "text/event-stream")
            self.send_header("connection", "close")
            if entry.get("drop") == "chunked":
                self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            self.close_connection = True
            if entry.get("drop"):
                self.wfile.flush()
                return
            if entry.get("malformed"):
                self.wfile.write(b'data: {"id": "x", "choices": [{"delta": \n\n')
                self.wfile.flush()
                return
            content, calls, finish, usage = _reply(server, body, entry)
            base = {
                "id": f"chatcmpl-{server.served}",
                "object": "chat.completion.chunk",
                "created": int(time.time()),
                "model": body.get("model", server.model),
            }

            def send(delta: dict, finish_reason: str | None = None, **extra: object) -> None:
                chunk = dict(
                    base,
                    choices=[{"index": 0, "delta": delta, "finish_reason": finish_reason}],
                    **extra,
                )
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()

            send({"role": "assistant", "content": ""})
            for i, delta in enumerate(_pieces(entry, content, calls)):
                if i == entry.get("stall_after"):
                    time.sleep(entry.get("stall_s", 3.0))  # the client gives up meanwhile
                    return  # then the connection closes with the reply unfinished
                if i == entry.get("stream_error_after"):
                    error = _error(entry.get("message") or "scripted stream error", "500")
                    self.wfile.write(b"data: " + json.dumps(error).encode() + b"\n\n")
                    self.wfile.flush()
                    return
                if i and entry.get("chunk_delay"):
                    time.sleep(entry["chunk_delay"])
                send(delta)
            send({}, finish)
            if server.stream_usage and (body.get("stream_options") or {}).get("include_usage"):
                chunk = dict(base, choices=[], usage=usage)
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()

        def _withhold(self, entry: dict, streamed: bool) -> None:
            """Answer 200 and send no reply: pings only, or nothing at all after the headers."""
            self.send_response(200)
            if streamed:
                self.send_header("content-type", "text/event-stream")
            else:  # a body that never comes
                self.send_header("content-type", "application/json")
                self.send_header("content-length", "100")
            self.send_header("connection", "close")
            self.end_headers()
            self.wfile.flush()
            self.close_connection = True
            every = entry.get("ping_every")
            if not every:
                time.sleep(entry["headers_only"])
                return
            ends = time.monotonic() + entry.get("for_s", 600.0)
            while time.monotonic() < ends:  # until the client closes the connection
                time.sleep(every)
                self.wfile.write(b": ping\n\n")
                self.wfile.flush()

        def _json(self, status: int, obj: dict, headers: dict | None = None) -> None:
            self._send(status, json.dumps(obj).encode(), "application/json", headers)

        def _send(self, status: int, data: bytes, ctype: str, headers: dict | None = None) -> None:
            self.send_response(status)
            self.send_header("content-type", ctype)
            self.send_header("content-length", str(len(data)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(data)

    return Handler


def _pieces(entry: dict, content: str, calls: list[dict]) -> list[dict]:
    """The deltas a streamed reply is sent in: reasoning, content, then each tool call."""
    size = int(entry.get("chunk_size") or 7)
    reasoning = entry.get("reasoning") or ""
    deltas: list[dict] = [
        {"reasoning_content": reasoning[i : i + size]} for i in range(0, len(reasoning), size)
    ]
    deltas += [{"content": content[i : i + size]} for i in range(0, len(content), size)]
    for index, call in enumerate(calls):
        fn = call["function"]
        first = {"index": index, "id": call["id"], "type": "function"}
        deltas.append({"tool_calls": [dict(first, function={"name": fn["name"], "arguments": ""})]})
        deltas += [
            {
                "tool_calls": [
                    {"index": index, "function": {"arguments": fn["arguments"][i : i + 11]}}
                ]
            }
            for i in range(0, len(fn["arguments"]), 11)
        ]
    return deltas


def _reply(server: ScriptedServer, body: dict, entry: dict) -> tuple[str, list[dict], str, dict]:
    content = entry.get("content") or ""
    finish = entry.get("finish_reason")
    if server.honor_stop and body.get("stop") and content:
        stops = body["stop"] if isinstance(body["stop"], list) else [body["stop"]]
        cut = min((content.find(s) for s in stops if s in content), default=-1)
        if cut >= 0:
            content, finish = content[:cut], finish or "stop"
    calls = []
    for i, call in enumerate(entry.get("tool_calls") or []):
        args = call.get("arguments", {})
        calls.append(
            {
                "id": call.get("id") or f"call_{server.served}_{i}",
                "type": "function",
                "function": {
                    "name": call["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
        )
    finish = finish or ("tool_calls" if calls else "stop")
    prompt = sum(len(json.dumps(m.get("content") or "")) for m in body.get("messages", [])) // 4 + 1
    completion = (len(content) + sum(len(c["function"]["arguments"]) for c in calls)) // 4 + 1
    usage = entry.get("usage") or {"prompt_tokens": prompt, "completion_tokens": completion}
    usage = dict(usage, total_tokens=usage["prompt_tokens"] + usage["completion_tokens"])
    return content, calls, finish, usage


def _error(message: str, code: str) -> dict:
    return {
        "error": {"message": message, "type": "invalid_request_error", "param": None, "code": code}
    }
