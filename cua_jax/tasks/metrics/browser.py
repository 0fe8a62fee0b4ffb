"""Metrics on Chrome's state as OSWorld's Chrome getters return it (OSWorld's chrome.py):
the active tab, bookmarks, extensions, history, experiments, font size, desktop
shortcuts. The ones that compare URLs by registered domain (public-suffix list) are not
implemented (see KNOWN_UNIMPLEMENTED)."""

from __future__ import annotations

import itertools
import re
from typing import Any
from urllib.parse import urlparse, urlunparse

from cua_jax.tasks.metrics.base import JudgeError, metric, rule


def _url_of(tab: Any) -> str | None:
    if isinstance(tab, str):
        return tab
    if isinstance(tab, dict) and isinstance(tab.get("url"), str):
        return tab["url"]
    return None


def _search(pattern: str, text: str) -> bool:
    try:
        return re.search(pattern, text) is not None
    except re.error as error:
        raise JudgeError(f"bad regular expression {pattern!r}: {error}") from None


def _rule_type(rules: dict, known: tuple[str, ...], name: str) -> str:
    kind = rule(rules, "type")
    if kind not in known:
        raise JudgeError(f"{name} rule type {kind!r} is not one of {list(known)}")
    return kind


@metric()
def is_expected_active_tab_approximate(active_tab: Any, rules: dict) -> float:
    """rules {"type": "url", "url": u}: 1 when the active tab's URL equals u, query strings
    ignored."""
    _rule_type(rules, ("url",), "is_expected_active_tab_approximate")
    wanted, actual = rule(rules, "url"), _url_of(active_tab)
    if not actual:
        return 0.0

    def without_query(url: str) -> str:
        return urlunparse(urlparse(url)._replace(query=""))

    return float(without_query(wanted) == without_query(actual))


@metric()
def is_expected_url_pattern_match(active_tab: Any, rules: dict) -> float:
    """1 when every regex of rules['expected'] is found in the URL (a string or a tab)."""
    patterns = rule(rules, "expected")
    url = _url_of(active_tab)
    if not url:
        return 0.0
    return float(all(_search(p, url) for p in patterns))


@metric()
def is_expected_search_query(active_tab: Any, rules: dict) -> float:
    """1 when rules['expect']['pattern'] is found in the active tab's URL."""
    pattern = rule(rule(rules, "expect"), "pattern")
    url = _url_of(active_tab)
    return float(bool(url) and _search(pattern, url))


_EXTENSION_ALIASES = ({"Zoom Chrome Extension", "Zoom for Google Chrome"},)


@metric()
def is_expected_installed_extensions(installed: Any, rules: dict) -> float:
    """1 when every extension name of rules['expected'] is installed (known renamings of an
    extension count as the same)."""
    wanted = rule(rules, "expected")
    if not installed:
        return 0.0

    def canonical(name: str) -> str:
        return next((sorted(group)[0] for group in _EXTENSION_ALIASES if name in group), name)

    return float({canonical(n) for n in wanted} <= {canonical(n) for n in installed})


@metric()
def is_expected_bookmarks(bookmarks: Any, rules: dict) -> float:
    """Chrome's bookmarks against rules of type bookmark_bar_folders_names (the bar's folder
    names are `names`), bookmark_bar_websites_urls (its URLs are `urls`) or
    liked_authors_websites_urls (a "Liked Authors" folder on the bar holds exactly one of
    the alternatives given for each URL of `urls`)."""
    kind = _rule_type(
        rules,
        ("bookmark_bar_folders_names", "bookmark_bar_websites_urls", "liked_authors_websites_urls"),
        "is_expected_bookmarks",
    )
    if not bookmarks:
        return 0.0
    try:
        bar = bookmarks["bookmark_bar"]["children"]
    except (KeyError, TypeError):
        return 0.0
    if kind == "bookmark_bar_folders_names":
        return float({b["name"] for b in bar if b.get("type") == "folder"} == set(rule(rules, "names")))
    if kind == "bookmark_bar_websites_urls":
        return float({b["url"] for b in bar if b.get("type") == "url"} == set(rule(rules, "urls")))
    folder = next((b for b in bar if b.get("type") == "folder" and b.get("name") == "Liked Authors"), None)
    if folder is None:
        return 0.0
    urls = {b["url"] for b in folder.get("children", []) if b.get("type") == "url"}
    choices = [[u] if isinstance(u, str) else list(u) for u in rule(rules, "urls")]
    return float(any(set(combination) == urls for combination in itertools.product(*choices)))


@metric()
def is_shortcut_on_desktop(shortcuts: Any, rules: dict) -> float:
    """rules {"type": "name", "name": n} or {"type": "exec", "exec": e}: 1 when some desktop
    shortcut ({path: .desktop file text}) has that Name= (exact or, ignoring case, either
    containing the other) or Exec= line (exact or either containing the other)."""
    kind = _rule_type(rules, ("name", "exec"), "is_shortcut_on_desktop")
    wanted = rule(rules, kind)
    if not isinstance(shortcuts, dict):
        return 0.0
    key = "Name=" if kind == "name" else "Exec="
    for content in shortcuts.values():
        if f"{key}{wanted}\n" in content:
            return 1.0
        for line in content.split("\n"):
            if not line.startswith(key):
                continue
            actual = line[len(key) :]
            first, second = (actual.lower(), wanted.lower()) if kind == "name" else (actual, wanted)
            if actual == wanted or second in first or first in second:
                return 1.0
    return 0.0


@metric()
def check_history_deleted(history: Any, rules: dict) -> float:
    """rules {"type": "keywords", "keywords": [...]}: 1 when no history entry's URL (the
    first item of each entry) contains a keyword."""
    _rule_type(rules, ("keywords",), "check_history_deleted")
    keywords = rule(rules, "keywords")
    urls = [entry[0] for entry in history or []]
    return float(not any(k in url for k in keywords for url in urls))


@metric()
def check_enabled_experiments(experiments: Any, rules: dict) -> float:
    """rules {"type": "names", "names": [...]}: 1 when the enabled chrome://flags
    experiments (without their "@option" suffix) are exactly those names, in order."""
    _rule_type(rules, ("names",), "check_enabled_experiments")
    names = [e.split("@")[0] for e in experiments or []]
    return float(names == rule(rules, "names"))


@metric()
def check_font_size(font_size: Any, rules: dict) -> float:
    """rules {"type": "value", "value": v} (the default font size is v) or {"type": "range",
    "min": a, "max": b} (a < size < b)."""
    kind = _rule_type(rules, ("value", "range"), "check_font_size")
    if not isinstance(font_size, dict) or "default_font_size" not in font_size:
        return 0.0
    size = font_size["default_font_size"]
    if kind == "value":
        return float(size == rule(rules, "value"))
    try:
        return float(rule(rules, "min") < size < rule(rules, "max"))
    except TypeError:
        return 0.0


@metric()
def is_added_to_steam_cart(active_tab: Any, rules: dict) -> float:
    """1 when the active tab's content contains every item of rules['items']."""
    items = rule(rules, "items")
    content = active_tab.get("content") if isinstance(active_tab, dict) else None
    return float(isinstance(content, str) and all(item in content for item in items))
