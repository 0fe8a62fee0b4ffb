"""A stand-in for an LLM: an OpenAI-compatible chat server on loopback that replays
recorded responses. It serves tests and offline runs of the LLM path; it is not a model.

A recording is a list of entries {"role": str, "match": str (optional), "content": str,
"delay_s": float (optional), "status": int (optional: answer with this HTTP error
instead, e.g. 503, to replay a transient failure)}. A request's role comes from its system message
(`VeriGen role: <role>`, cua_jax.tasks.verigen.llm); it gets the first unused entry of
that role whose `match` occurs in its user message. When none is left the server
answers 404 (the client does not retry a 4xx), so an exhausted recording is an error,
never a hang. Token counts in `usage` are whitespace-separated words.

    with ReplayServer(entries) as server:       # binds 127.0.0.1 on a free port
        client = ChatClient(server.base_url, model="replay")
"""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid
from typing import Any

from cua_jax.tasks.verigen.llm import ROLE_HEADER


class ReplayServer:
    def __init__(self, entries: list[dict[str, Any]], host: str = "127.0.0.1"):
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError(f"the replay server binds loopback only, not {host!r}")
        for index, entry in enumerate(entries):
            if not isinstance(entry.get("role"), str) or not isinstance(entry.get("content"), str):
                raise ValueError(f"recording entry {index} needs a 'role' and a 'content' string")
        self.entries = [dict(e) for e in entries]
        self._used = [False] * len(entries)
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []  # {role, entry (index or None), user message} per request
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def _reply(self, code: int, value: Any) -> None:
                data = json.dumps(value).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self) -> None:
                if self.path.rstrip("/") not in ("/v1/chat/completions", "/chat/completions"):
                    self._reply(404, {"error": {"message": f"no route {self.path}"}})
                    return
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                    messages = body["messages"]
                except (ValueError, KeyError, TypeError):
                    self._reply(400, {"error": {"message": "the body must be a JSON chat request"}})
                    return
                code, value = server._answer(body, messages)
                self._reply(code, value)

        self._httpd = http.server.ThreadingHTTPServer((host, 0), Handler)
        self._httpd.daemon_threads = True
        self.base_url = f"http://{host}:{self._httpd.server_address[1]}/v1"
        self._thread: threading.Thread | None = None

    def _answer(self, body: dict[str, Any], messages: list[dict[str, Any]]) -> tuple[int, dict[str, Any]]:
        system = next((m.get("content", "") for m in messages if m.get("role") == "system"), "")
        user = "\n".join(str(m.get("content", "")) for m in messages if m.get("role") == "user")
        role = system[len(ROLE_HEADER) :].split("\n", 1)[0] if system.startswith(ROLE_HEADER) else ""
        with self._lock:
            index = next(
                (
                    i
                    for i, e in enumerate(self.entries)
                    if not self._used[i] and e["role"] == role and e.get("match", "") in user
                ),
                None,
            )
            if index is not None:
                self._used[index] = True
            self.requests.append({"role": role, "entry": index, "user": user})
        if index is None:
            return 404, {"error": {"message": f"no recorded response left for role {role!r}"}}
        entry = self.entries[index]
        time.sleep(float(entry.get("delay_s", 0.0)))
        if "status" in entry:
            return int(entry["status"]), {"error": {"message": f"recorded failure {entry['status']}"}}
        prompt_tokens = sum(len(str(m.get("content", "")).split()) for m in messages)
        completion_tokens = len(entry["content"].split())
        return 200, {
            "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": body.get("model", "replay"),
            "choices": [
                {"index": 0, "message": {"role": "assistant", "content": entry["content"]}, "finish_reason": "stop"}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    def unused(self) -> list[int]:
        with self._lock:
            return [i for i, used in enumerate(self._used) if not used]

    def start(self) -> ReplayServer:
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True, name="replay-server")
        self._thread.start()
        return self

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def __enter__(self) -> ReplayServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
