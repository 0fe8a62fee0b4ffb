"""The LLM roles over any OpenAI-compatible chat endpoint (a vLLM server, or a hosted API).

`ChatClient` makes every call with a per-call timeout and bounded retries (timeouts,
connection errors, 5xx and 429 are retried with backoff; other 4xx are not) and records
each call in a `Ledger` (role, latency, tokens, attempts, cost at the configured prices).

Each role's system prompt starts with `VeriGen role: <role>` and asks for one JSON
object; `extract_json` takes the first JSON object from the reply (fenced or bare). A
reply without one, or with fields of the wrong type, becomes a ProposalError whose
message names the problem; the candidate is then rejected with that reason.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import threading
import time
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.tasks.verigen.candidate import Candidate, Feedback, Part
from cua_jax.tasks.verigen.pipeline import ProposalError
from cua_jax.tasks.verigen.probe import ProbeSession
from cua_jax.tasks.verigen.roles import Checker

ROLE_HEADER = "VeriGen role: "


class ChatError(RuntimeError):
    """A chat call failed after its retries (the message says how)."""


@dataclasses.dataclass
class CallRecord:
    role: str
    seconds: float
    prompt_tokens: int
    completion_tokens: int
    attempts: int
    ok: bool
    cost_usd: float
    error: str = ""


class Ledger:
    """Thread-safe record of every chat call: latency, tokens, attempts, cost."""

    def __init__(self):
        self._lock = threading.Lock()
        self.calls: list[CallRecord] = []

    def record(self, record: CallRecord) -> None:
        with self._lock:
            self.calls.append(record)

    def cost(self) -> float:
        with self._lock:
            return sum(c.cost_usd for c in self.calls)

    def summary(self) -> dict[str, Any]:
        with self._lock:
            calls = list(self.calls)
        by_role: dict[str, dict[str, Any]] = {}
        for call in calls:
            row = by_role.setdefault(
                call.role,
                {
                    "calls": 0,
                    "failed": 0,
                    "retries": 0,
                    "seconds": 0.0,
                    "prompt_tokens": 0,
                    "completion_tokens": 0,
                    "cost_usd": 0.0,
                },
            )
            row["calls"] += 1
            row["failed"] += not call.ok
            row["retries"] += call.attempts - 1
            row["seconds"] += call.seconds
            row["prompt_tokens"] += call.prompt_tokens
            row["completion_tokens"] += call.completion_tokens
            row["cost_usd"] += call.cost_usd
        for row in by_role.values():
            row["mean_latency_s"] = row["seconds"] / row["calls"]
        return {"calls": len(calls), "cost_usd": sum(c.cost_usd for c in calls), "by_role": by_role}


class ChatClient:
    """Chat completions with a per-call timeout, retries and a ledger.

    Args:
        base_url: the endpoint, e.g. http://127.0.0.1:8000/v1.
        model: the model name the endpoint serves.
        api_key_env: the environment variable holding the key (a local server needs none).
        price_prompt / price_completion: USD per million tokens, for the ledger's cost.
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 120.0,
        retries: int = 2,
        backoff: float = 0.5,
        temperature: float = 0.7,
        max_tokens: int = 2048,
        price_prompt: float = 0.0,
        price_completion: float = 0.0,
        ledger: Ledger | None = None,
    ):
        import openai

        self._openai = openai
        self.client = openai.OpenAI(
            base_url=base_url, api_key=os.environ.get(api_key_env) or "not-needed", timeout=timeout, max_retries=0
        )
        self.model, self.retries, self.backoff = model, retries, backoff
        self.temperature, self.max_tokens = temperature, max_tokens
        self.price_prompt, self.price_completion = price_prompt, price_completion
        self.ledger = ledger or Ledger()

    def chat(self, role: str, system: str, user: str) -> str:
        openai = self._openai
        retryable = (
            openai.APITimeoutError,
            openai.APIConnectionError,
            openai.InternalServerError,
            openai.RateLimitError,
        )
        started, error = time.monotonic(), ""
        for attempt in range(1, self.retries + 2):
            try:
                reply = self.client.chat.completions.create(
                    model=self.model,
                    temperature=self.temperature,
                    max_tokens=self.max_tokens,
                    messages=[
                        {"role": "system", "content": ROLE_HEADER + role + "\n" + system},
                        {"role": "user", "content": user},
                    ],
                )
            except retryable as exc:
                error = f"{type(exc).__name__}: {exc}"
                if attempt <= self.retries:
                    time.sleep(self.backoff * 2 ** (attempt - 1))
                continue
            except openai.APIError as exc:
                error = f"{type(exc).__name__}: {exc}"
                break
            usage = reply.usage
            prompt, completion = (usage.prompt_tokens, usage.completion_tokens) if usage else (0, 0)
            cost = (prompt * self.price_prompt + completion * self.price_completion) / 1e6
            self.ledger.record(CallRecord(role, time.monotonic() - started, prompt, completion, attempt, True, cost))
            content = reply.choices[0].message.content if reply.choices else None
            return content or ""
        self.ledger.record(CallRecord(role, time.monotonic() - started, 0, 0, attempt, False, 0.0, error))
        raise ChatError(f"{role} call failed after {attempt} attempt(s): {error}")


def extract_json(text: str, what: str) -> dict[str, Any]:
    """The first JSON object in a model reply; ProposalError when there is none."""
    decoder = json.JSONDecoder()
    for start in (i for i, char in enumerate(text) if char == "{"):
        try:
            value, _ = decoder.raw_decode(text, start)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    raise ProposalError(f"the {what} reply holds no JSON object: {text[:120]!r}")


def _field(obj: dict, name: str, kind, what: str):
    if name not in obj:
        raise ProposalError(f"the {what} reply lacks '{name}'")
    if not isinstance(obj[name], kind) or isinstance(obj[name], bool) and kind is not bool:
        raise ProposalError(
            f"the {what} reply's '{name}' must be {getattr(kind, '__name__', kind)}, got {type(obj[name]).__name__}"
        )
    return obj[name]


def action_texts(items: Any, what: str) -> list[str]:
    """Action texts from a reply's list of actions (tool-call texts or argument objects)."""
    if not isinstance(items, list):
        raise ProposalError(f"the {what} reply's actions must be a list")
    texts = []
    for index, item in enumerate(items):
        action = A.parse_arguments(item) if isinstance(item, dict) else A.parse_action(item)
        if isinstance(action, A.InvalidAction):
            raise ProposalError(f"the {what} reply's action {index} is invalid: {action.message}")
        texts.append(A.render_action(action))
    return texts


def candidate_from_reply(obj: dict[str, Any], what: str, augmentation: str = "llm") -> Candidate:
    """A candidate from a proposer / fixer reply (its fields are named in PROPOSAL_FORMAT)."""
    instruction = _field(obj, "instruction", str, what)
    code = _field(obj, "judge_code", str, what)
    entry = _field(obj, "judge_entry", str, what)
    config = obj.get("config", [])
    if not isinstance(config, list):
        raise ProposalError(f"the {what} reply's 'config' must be a list")
    solution = action_texts(_field(obj, "solution", list, what), what)
    app = str(obj.get("app", "desktop"))
    digest = hashlib.sha256((instruction + code).encode()).hexdigest()[:10]
    task = {
        "id": str(obj.get("id") or f"verigen-llm-{digest}"),
        "snapshot": "desktop",
        "instruction": instruction,
        "source": "verigen llm proposer",
        "config": config,
        "related_apps": [app],
        "evaluator": {"func": "python_judge", "code": code, "entry": entry, "timeout": obj.get("judge_timeout", 20)},
    }
    metadata = {
        "app": app,
        "family": "llm",
        "difficulty": obj.get("difficulty", "medium"),
        "estimated_steps": obj.get("estimated_steps", len(solution)),
        "augmentation": augmentation,
        "stated": [str(s) for s in obj.get("stated", [])],
    }
    return Candidate(task, solution, metadata, [Part(instruction, code, entry, 0, len(solution))])


def candidate_to_reply(candidate: Candidate) -> dict[str, Any]:
    """A candidate in the reply format (what the judger and fixer are shown)."""
    evaluator = candidate.task.get("evaluator", {})
    return {
        "id": candidate.id,
        "instruction": candidate.instruction,
        "config": candidate.task.get("config", []),
        "judge_code": evaluator.get("code", ""),
        "judge_entry": evaluator.get("entry", ""),
        "judge_timeout": evaluator.get("timeout", 20),
        "solution": candidate.solution,
        "app": candidate.metadata.get("app"),
        "difficulty": candidate.metadata.get("difficulty"),
        "estimated_steps": candidate.metadata.get("estimated_steps"),
        "stated": candidate.metadata.get("stated", []),
    }


PROPOSAL_FORMAT = """Answer with one JSON object:
{"instruction": str, "config": [OSWorld setup steps], "judge_code": str (Python, standard library only,
defining judge_entry: a function of no arguments that reads the final state and returns 1.0 or 0.0;
deterministic, no network, no writes, no while loops), "judge_entry": str, "judge_timeout": seconds <= 30,
"solution": [actions as tool-call argument objects, e.g. {"action": "write_file", "path": ..., "content": ...}],
"app": str, "difficulty": "easy"|"medium"|"hard", "estimated_steps": int, "stated": [values the instruction states]}"""


class LLMProposer:
    """Writes `n` candidates per call as `n` chat calls in parallel (ScaleCUA App. B.2)."""

    serial = False

    def __init__(self, chat: ChatClient):
        self.chat = chat

    def _one(self, slot: int, n: int, knowledge: str, observation: str) -> Candidate | ProposalError:
        user = (
            f"Environment knowledge:\n{knowledge}\n\nCurrent screen (accessibility text):\n{observation[:4000]}\n\n"
            f"Write one new verifiable task. Candidate slot {slot} of {n}."
        )
        try:
            return candidate_from_reply(
                extract_json(self.chat.chat("proposer", PROPOSAL_FORMAT, user), "proposer"), "proposer"
            )
        except (ProposalError, ChatError) as error:
            return ProposalError(str(error))

    def propose(self, n: int, knowledge: str = "", observation: str = "") -> list[Candidate | ProposalError]:
        with concurrent.futures.ThreadPoolExecutor(n) as executor:
            return list(executor.map(lambda slot: self._one(slot, n, knowledge, observation), range(n)))


class LLMJudger:
    SYSTEM = (
        "Review the task statically: is the instruction unambiguous and meaningful, does it state every value "
        "the judge requires, is the judge's logic sound? Answer with one JSON object: "
        '{"pass": bool, "score": float in [0, 1], "reasons": [str]}'
    )

    def __init__(self, chat: ChatClient):
        self.chat = chat

    def review(self, candidate: Candidate) -> Feedback:
        user = "Task " + candidate.id + ":\n" + json.dumps(candidate_to_reply(candidate), indent=1)
        try:
            obj = extract_json(self.chat.chat("judger", self.SYSTEM, user), "judger")
            verdict = _field(obj, "pass", bool, "judger")
            score = float(obj.get("score", 1.0 if verdict else 0.0))
            reasons = [str(r) for r in obj.get("reasons", [])] if isinstance(obj.get("reasons", []), list) else []
        except (ProposalError, ChatError, TypeError, ValueError) as error:
            return Feedback("judger", False, [f"no verdict: {error}"], 0.0)
        return Feedback(
            "judger", verdict, [] if verdict else reasons or ["rejected without a reason"], min(1.0, max(0.0, score))
        )


class LLMChecker(Checker):
    """The dry run with the model choosing the actions from what it observes."""

    name = "llm"
    SYSTEM = (
        'Solve the task in the live desktop. Answer with one JSON object: {"actions": [tool-call argument '
        'objects, e.g. {"action": "key", "keys": ["ctrl", "s"]}]}'
    )

    def __init__(self, probe, chat: ChatClient, **kwargs):
        super().__init__(probe, **kwargs)
        self.chat = chat

    def plan(self, candidate: Candidate, session: ProbeSession) -> list[str]:
        _, tree = session.observe()
        user = f"Task {candidate.id}: {candidate.instruction}\n\nScreen (accessibility text):\n{tree[:4000]}"
        try:
            obj = extract_json(self.chat.chat("checker", self.SYSTEM, user), "checker")
            return action_texts(_field(obj, "actions", list, "checker"), "checker")
        except (ProposalError, ChatError) as error:
            raise ValueError(str(error)) from None


class LLMFixer:
    SYSTEM = "Repair the task so that it passes the feedback. " + PROPOSAL_FORMAT

    def __init__(self, chat: ChatClient):
        self.chat = chat

    def fix(self, candidate: Candidate, feedback: list[Feedback]) -> Candidate | None:
        user = (
            f"Task {candidate.id}:\n{json.dumps(candidate_to_reply(candidate), indent=1)}\n\nFeedback:\n"
            + "\n".join(f.summary() for f in feedback)
        )
        try:
            obj = extract_json(self.chat.chat("fixer", self.SYSTEM, user), "fixer")
        except ChatError as error:
            raise ProposalError(f"fixer: {error}") from None
        fixed = candidate_from_reply(
            {**obj, "id": candidate.id}, "fixer", candidate.metadata.get("augmentation", "llm")
        )
        fixed.history = candidate.history
        fixed.repairs = candidate.repairs + [
            {"round": len(candidate.repairs) + 1, "by": "llm", "feedback": [f.summary() for f in feedback]}
        ]
        return fixed
