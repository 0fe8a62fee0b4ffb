"""The MiniWoB oracle as a rollout engine: `OracleDemonstrator` answers each request of the agent
loop with the oracle's action for the page the prompt shows, so its episodes are demonstrations
made of exactly the token streams an RL rollout of the same episode would be (the supervised warm
start's, `cua_jax.train.warm_start`; the oracle policy of `experiments.policies`).

The demonstrator is a policy over the agent's own prompt: it reads the instruction and the
page's DOM text (observations made with include_dom_text=True) back out of the prompt ids and
answers one short reasoning line plus the oracle's tool call, e.g.

    Click BUTTON 'ok'.
    <tool_call>
    {"name": "computer_use", "arguments": {"action": "left_click", "coordinate": [343, 538]}}
    </tool_call>

`CodeOracleEngine` does the same for a code task: it replies with the task's oracle tool calls
(`code_suite.oracle_actions`) in order (`cua_jax.train.code_demonstrations`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cua_jax.envs import actions as A
from cua_jax.envs.miniwob import DomElement, MiniWoBObservation, dom_from_text, dom_line
from cua_jax.envs.miniwob_oracle import OracleError, oracle_action
from cua_jax.envs.prompts import DOM_TEXT_HEADER
from cua_jax.rollout.engine import (
    FinishReason,
    Generation,
    GenerationRequest,
    SamplingConfig,
    ScriptedEngine,
)

# ------------------------------------------------------------------------------------
# Reading the page back out of a prompt
# ------------------------------------------------------------------------------------

_USER_START = "<|im_start|>user\n"
_TURN_END = "<|im_end|>"


def observation_from_prompt(prompt_text: str, task: str, screenshot: np.ndarray) -> MiniWoBObservation:
    """The MiniWoB observation an agent prompt shows: its first user message starts with the
    instruction (the utterance); its last user message holds the page as DOM text."""
    users = prompt_text.split(_USER_START)
    if len(users) < 2:
        raise ValueError("the prompt has no user message")
    utterance = users[1].split("\n", 1)[0]
    last = users[-1].split(_TURN_END, 1)[0]
    if DOM_TEXT_HEADER not in last:
        raise ValueError(
            "the prompt's last observation holds no DOM text: demonstrations need observations made "
            "with include_dom_text=True"
        )
    dom_text = last.split(DOM_TEXT_HEADER, 1)[1].rstrip("\n")
    return MiniWoBObservation(task, utterance, screenshot, dom_from_text(dom_text))


# ------------------------------------------------------------------------------------
# The demonstrator
# ------------------------------------------------------------------------------------


def _element_at(observation: MiniWoBObservation, px: float, py: float) -> DomElement | None:
    """The deepest named element (not a text fragment) whose box holds the point, if any."""
    found = None
    for element in observation.dom:
        inside = (
            element.left <= px <= element.left + element.width and element.top <= py <= element.top + element.height
        )
        if inside and element.tag != "t" and (found is None or element.depth >= found.depth):
            found = element
    return found


def _element_name(element: DomElement) -> str:
    return element.tag + (f"#{element.id}" if element.id else "")


def reasoning_line(action: A.Action, observation: MiniWoBObservation) -> str:
    """One short sentence saying what the action does, in terms of the page (copied from the prompt)."""
    if isinstance(action, A.ELEMENT_ACTIONS):
        # The target's line of the id-last DOM text, copied whole: the id comes last, after the
        # span that picks the element out (`miniwob.dom_to_text`).
        target = next((e for e in observation.dom if e.ref == action.element), None)
        line = f"[{action.element}]" if target is None else dom_line(target, geometry=False)
        if isinstance(action, A.FillElement):
            return f"Fill {line} with {action.text!r}."
        return f"Click {line}."
    if isinstance(action, A.Click):
        width, height = observation.screen_size
        target = _element_at(observation, *A.grid_to_pixels(action.x, action.y, width, height))
        if target is None:
            return "Click the page."
        name = _element_name(target)
        return f"Click {name} {target.text!r}." if target.text else f"Click {name}."
    if isinstance(action, A.Type):
        return f"Type {action.text!r}."
    if isinstance(action, A.Key):
        return f"Press {'+'.join(action.keys)}."
    return f"{type(action).__name__}."


def demonstration_reply(
    observation: MiniWoBObservation, reasoning: bool = True, action_space: str = "coordinates"
) -> str:
    """The oracle's reply to `observation` in `action_space`: a reasoning line (optional) and its tool call."""
    action = oracle_action(observation, action_space)
    call = A.render_action(action)
    return f"{reasoning_line(action, observation)}\n{call}" if reasoning else call


class OracleDemonstrator(ScriptedEngine):
    """The MiniWoB oracle as a deterministic policy (logprob 0 per token) for one task.

    Each request's prompt is decoded, the observation read back (`observation_from_prompt`,
    the last image is the current screenshot) and answered with `demonstration_reply` plus the
    end-of-turn token. A page the oracle cannot read, or a reply longer than the run's
    max_new_tokens (a policy could not write it), is answered with a FAIL call, which ends the
    episode as a failure (rejected, not demonstrated); the message is kept in `errors`.
    """

    name = "the oracle demonstrator"

    def __init__(
        self, tokenizer, end_of_turn_id: int, task: str, *, reasoning: bool = True, action_space: str = "coordinates"
    ):
        self.tokenizer = tokenizer
        self.end_of_turn_id = int(end_of_turn_id)
        self.task = task
        self.reasoning = reasoning
        self.action_space = A.check_action_space(action_space)
        self.errors: list[str] = []

    def reply_text(self, request: GenerationRequest) -> str:
        if not request.images:
            raise ValueError("a demonstration request needs the current screenshot")
        text = self.tokenizer.decode(request.prompt_ids.tolist(), skip_special_tokens=False)
        observation = observation_from_prompt(text, self.task, request.images[-1])
        try:
            return demonstration_reply(observation, self.reasoning, self.action_space)
        except OracleError as error:
            self.errors.append(f"{self.task}: {error}")
            return A.render_action(A.Fail())

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for request in requests:
            ids = self.tokenizer.encode(self.reply_text(request), add_special_tokens=False)
            ids = np.asarray([*ids, self.end_of_turn_id], np.int32)
            if len(ids) > sampling.max_new_tokens:
                self.errors.append(
                    f"{self.task}: the demonstration reply has {len(ids)} tokens, more than "
                    f"max_new_tokens ({sampling.max_new_tokens})"
                )
                ids = np.asarray(
                    [*self.tokenizer.encode(A.render_action(A.Fail()), add_special_tokens=False), self.end_of_turn_id],
                    np.int32,
                )
            out.append(Generation(ids, np.zeros(len(ids), np.float32), FinishReason.STOP, 0))
        return out


class CodeOracleEngine(ScriptedEngine):
    """Replies with a code task's oracle tool calls in order (logprob 0 per token): a request
    whose prompt already holds the script's first t replies gets reply t. A reply longer than
    max_new_tokens (a policy could not write it) is cut there and noted in `errors`."""

    name = "the code oracle"

    def __init__(self, tokenizer, end_of_turn_id: int, task_id: str, script: Sequence[str]):
        if not script:
            raise ValueError(f"{task_id}: the oracle's script is empty")
        self.tokenizer, self.end_of_turn_id = tokenizer, int(end_of_turn_id)
        self.task_id, self.script = task_id, list(script)
        self.errors: list[str] = []

    def reply_index(self, prompt_text: str) -> int:
        """How many of the script's replies the prompt already holds, in order."""
        done, position = 0, 0
        for reply in self.script:
            found = prompt_text.find(reply, position)
            if found < 0:
                break
            done, position = done + 1, found + len(reply)
        return min(done, len(self.script) - 1)

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingConfig) -> list[Generation]:
        out = []
        for request in requests:
            text = self.tokenizer.decode(request.prompt_ids.tolist(), skip_special_tokens=False)
            reply = self.script[self.reply_index(text)]
            ids = np.asarray([*self.tokenizer.encode(reply, add_special_tokens=False), self.end_of_turn_id], np.int32)
            finish = FinishReason.STOP
            if len(ids) > sampling.max_new_tokens:
                self.errors.append(
                    f"{self.task_id}: the oracle's reply has {len(ids)} tokens, more than "
                    f"max_new_tokens ({sampling.max_new_tokens})"
                )
                ids, finish = ids[: sampling.max_new_tokens], FinishReason.LENGTH
            out.append(Generation(ids, np.zeros(len(ids), np.float32), finish, 0))
        return out
