"""The agent's system prompt and the text of its observations.

The action space in the system prompt is rendered from `cua_jax.envs.actions` (the tool
schema `tool_description` and an example call made by `render_action`), so the prompt
always describes exactly what the parser accepts. Two styles (`PROMPT_STYLES`):

* "tool_schema": the tool's JSON schema, as Qwen's chat template lists tools (562 tokens
  of the shipped tiny tokenizer at 160x210).
* "compact": the same actions and arguments in one line each, under half as long. Every
  prompt of an episode starts with the system prompt, so on a small policy it is a large
  share of the tokens every rollout prefill and every learner pass pays for.
"""

from __future__ import annotations

import json

from cua_jax.envs import actions as A

# What every observation after the first one reports when the previous reply was not performed.
INVALID_ACTION_PREFIX = "Invalid action: "
DOM_TEXT_HEADER = "Page elements:\n"


PROMPT_STYLES = ("tool_schema", "compact")

# The compact style's lines: action names (as `parse_action` spells them) -> their arguments.
_COMPACT_ACTIONS = (
    ("|".join(A.CLICK_KINDS + ("mouse_move",)), "coordinate"),
    ("left_click_drag", "coordinate, start_coordinate?"),
    ("click_element", "element"),
    ("fill_element", "element, text"),
    ("left_mouse_down|left_mouse_up", "coordinate?"),
    ("key", "keys"),
    ("hold_key", "keys, duration"),
    ("type|answer", "text"),
    ("scroll", f"direction ({'|'.join(A.SCROLL_DIRECTIONS)}), amount, coordinate?"),
    ("wait", "time"),
    ("write_file", "path, content"),
    ("screenshot|cursor_position|done|DONE|FAIL|WAIT", ""),
)


def _compact_lines(action_space: str) -> str:
    allowed = set(A.action_names(action_space))
    lines = []
    for names, arguments in _COMPACT_ACTIONS:
        kept = [name for name in names.split("|") if name in allowed]
        if kept:
            if action_space == "elements":  # no pointer placement by grid point in this space
                arguments = arguments.replace(", coordinate?", "").replace("coordinate?", "")
            lines.append(f"{'|'.join(kept)} {arguments}".rstrip())
    return "\n".join(lines)


def system_prompt(
    screen_width: int, screen_height: int, style: str = "tool_schema", action_space: str = "coordinates"
) -> str:
    """The system prompt of a computer-use agent acting on a screen_width x screen_height screen.

    Holds the computer-use tool's actions of `action_space` (`actions.ACTION_SPACES`) in `style`
    (see the module doc) and one example call in the exact syntax `parse_action` reads.
    """
    if screen_width < 1 or screen_height < 1:
        raise ValueError(f"screen size must be positive, got {screen_width}x{screen_height}")
    if style not in PROMPT_STYLES:
        raise ValueError(f"unknown system prompt style {style!r}; choose one of {PROMPT_STYLES}")
    A.check_action_space(action_space)
    if action_space == "elements":
        example = A.render_action(A.ClickElement(1))
    else:
        example = A.render_action(A.Click("left_click", A.GRID // 2, A.GRID // 2))
    intro = (
        "You operate a computer to complete the user's task. Each turn you see a screenshot; "
        "think briefly, then reply with exactly one tool call.\n"
    )
    if style == "tool_schema":
        description = A.tool_description(screen_width, screen_height, action_space)["function"]
        schema = json.dumps(description, separators=(",", ":"))
        return f"{intro}Tool: {schema}\nExample reply:\n{example}"
    grid, ids = f"[x, y] on a {A.GRID}x{A.GRID} grid, [0, 0] top-left", "elements by the ids the page lists"
    where = {"coordinates": grid, "elements": ids, "both": f"{grid}, or {ids}"}[action_space]
    return (
        f"{intro}Tool {A.TOOL_NAME} on a {screen_width}x{screen_height} screen; {where}. "
        f"Actions and arguments (? optional):\n{_compact_lines(action_space)}\nExample reply:\n{example}"
    )


def observation_text(*, feedback: str = "", dom_text: str | None = None) -> str:
    """The text beside a turn's screenshots: feedback on the previous action, then the page's DOM as text."""
    parts = []
    if feedback:
        parts.append(feedback)
    if dom_text is not None:
        parts.append(DOM_TEXT_HEADER + dom_text)
    return "\n".join(parts)
