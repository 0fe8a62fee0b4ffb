"""An environment kind in one module: a page served over HTTP on 127.0.0.1, registered by
being imported (a run names this module in `env.kind_modules` and sets `env.kind =
"http_page"`; nothing else in the library knows it).

Each task is a page showing a word (drawn from the problem seed); the agent reads it from the
screenshot or the text and answers it (`answer(text="...")`). The verifier scores the answer:
1 for the page's word, 0 for anything else (declaring done or failure too). Other actions
change nothing and say so. The worker's shared resource is the HTTP server, one thread of the
worker's process; each environment fetches its page from it, as a browser would.
"""

from __future__ import annotations

import asyncio
import dataclasses
import html
import http.server
import json
import random
import threading
import urllib.parse
import urllib.request
from typing import Any

import numpy as np
from PIL import Image, ImageDraw

from cua_jax.environments.kinds import EnvironmentKind, register_kind
from cua_jax.envs import actions as A
from cua_jax.envs.contract import AgentEnvironment, EnvObservation, EnvReset, EnvTransition
from cua_jax.envs.faults import episode_outcome
from cua_jax.tasks.sources import SourceTask

KIND = "http_page"
WORDS = ("apple", "river", "stone", "cloud", "maple", "ember")
SCREEN = (160, 120)  # (width, height) of the page's screenshot


@dataclasses.dataclass(frozen=True)
class HttpPageConfig:
    """tasks: the pages a run trains on (each a task of the kind); timeout_s: a fetch's limit."""

    tasks: tuple[str, ...] = ("read-word", "read-word-twice")
    timeout_s: float = 10.0

    def __post_init__(self):
        if not self.tasks:
            raise ValueError("tasks: at least one page")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")


def page_word(task: str, seed: int) -> str:
    return random.Random(f"{task}/{seed}").choice(WORDS)


class _PageHandler(http.server.BaseHTTPRequestHandler):
    """GET /<task>?seed=N: the task's page, as JSON (instruction, word) a client renders."""

    def do_GET(self):  # the name http.server calls
        url = urllib.parse.urlsplit(self.path)
        task = url.path.strip("/")
        seed = int(urllib.parse.parse_qs(url.query).get("seed", ["0"])[0])
        if task not in self.server.tasks:
            self.send_error(404, f"no page {task!r}")
            return
        body = json.dumps({"instruction": "Answer with the word the page shows.", "word": page_word(task, seed)})
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args):  # quiet: tests run many requests
        pass


class PageServer:
    """The worker's HTTP server on 127.0.0.1 (a free port), serving its thread until closed."""

    def __init__(self, config: HttpPageConfig):
        self.config = config
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _PageHandler)
        self.httpd.tasks = frozenset(config.tasks)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="http-page-server")
        self.thread.start()
        self.requests = 0

    def fetch(self, task: str, seed: int) -> dict:
        """The page of `task` (blocking). An unknown page is the caller's error (ValueError);
        a server that does not answer raises what urllib raises (OSError: a fault)."""
        if task not in self.httpd.tasks:
            raise ValueError(f"{task!r} is no page of this server ({sorted(self.httpd.tasks)})")
        self.requests += 1
        with urllib.request.urlopen(f"{self.url}/{task}?seed={seed}", timeout=self.config.timeout_s) as answer:
            return json.loads(answer.read())

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def render(word: str, feedback: str = "") -> EnvObservation:
    image = Image.new("RGB", SCREEN, "white")
    ImageDraw.Draw(image).text((10, SCREEN[1] // 2 - 6), word, fill="black")
    text = "\n".join(part for part in (feedback, f"The page shows: {html.escape(word)}") if part)
    return EnvObservation((np.asarray(image, np.uint8),), text)


class HttpPageEnvironment(AgentEnvironment):
    """One episode at a time of a page of `server`."""

    def __init__(self, server: PageServer):
        self.server = server
        self.word: str | None = None

    async def _reset(self, task: str, seed: int | None) -> EnvReset:
        page = await asyncio.to_thread(self.server.fetch, task, 0 if seed is None else int(seed))
        self.word = page["word"]
        return EnvReset(page["instruction"], render(self.word), screen_size=SCREEN)

    async def _step(self, action: Any) -> EnvTransition:
        if self.word is None:
            raise RuntimeError("step() without a running episode (reset first)")
        if isinstance(action, A.Answer):
            reward = float(action.text.strip().lower() == self.word)
            self.word = None
            return EnvTransition(None, reward, episode_outcome(verdict=reward))
        if A.is_terminal(action):
            self.word = None
            return EnvTransition(None, 0.0, episode_outcome(verdict=0.0))
        if isinstance(action, A.InvalidAction):
            feedback = f"Invalid action: {action.message}"
        else:
            feedback = f"{type(action).__name__} changes nothing on this page"
        return EnvTransition(render(self.word, feedback))

    async def end_episode(self) -> None:
        self.word = None


def _tasks(config: HttpPageConfig) -> list[SourceTask]:
    return [SourceTask(task, KIND, KIND, 0, True, task, KIND) for task in config.tasks]


def _open(worker_config: Any) -> PageServer:
    return PageServer(worker_config.kind_config(KIND) or HttpPageConfig())


register_kind(
    EnvironmentKind(
        KIND,
        open=_open,
        make=lambda server, worker_config: HttpPageEnvironment(server),
        close=PageServer.close,
        stats=lambda server: {f"{KIND}/requests": float(server.requests)},
        config=HttpPageConfig,
        tasks=_tasks,
    )
)
