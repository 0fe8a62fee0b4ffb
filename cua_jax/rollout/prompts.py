"""The agent's system prompt and the text of its observations.

The action space in the system prompt is rendered from `cua_jax.envs.actions` (the tool
schema `tool_description` and an example call made by `render_action`), so the prompt
always describes exactly what the parser accepts.
"""

from __future__ import annotations

import json

from cua_jax.envs import actions as A

# What every observation after the first one reports when the previous reply was not performed.
INVALID_ACTION_PREFIX = "Invalid action: "
DOM_TEXT_HEADER = "Page elements:\n"


def system_prompt(screen_width: int, screen_height: int) -> str:
    """The system prompt of a computer-use agent acting on a screen_width x screen_height screen.

    Holds the computer-use tool's JSON schema (compact) and one example call in the exact
    syntax `parse_action` reads.
    """
    if screen_width < 1 or screen_height < 1:
        raise ValueError(f"screen size must be positive, got {screen_width}x{screen_height}")
    schema = json.dumps(A.tool_description(screen_width, screen_height)["function"], separators=(",", ":"))
    example = A.render_action(A.Click("left_click", A.GRID // 2, A.GRID // 2))
    return (
        "You operate a computer to complete the user's task. Each turn you see a screenshot; "
        "think briefly, then reply with exactly one tool call.\n"
        f"Tool: {schema}\n"
        f"Example reply:\n{example}"
    )


def observation_text(*, feedback: str = "", dom_text: str | None = None) -> str:
    """The text beside a turn's screenshots: feedback on the previous action, then the page's DOM as text."""
    parts = []
    if feedback:
        parts.append(feedback)
    if dom_text is not None:
        parts.append(DOM_TEXT_HEADER + dom_text)
    return "\n".join(parts)
