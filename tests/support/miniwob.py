"""MiniWoB task lists several test modules share."""

# The oracle's first tasks: test_miniwob runs them with more seeds and random baselines,
# test_miniwob_oracle_live every other task the oracle scripts.
BASIC_TASKS = (
    "click-button",
    "click-link",
    "click-checkboxes",
    "click-option",
    "enter-text",
    "focus-text",
    "click-tab",
    "click-dialog",
)
