"""Metrics on desktop applications' own files: VLC's vlcrc and status XML, LibreOffice's
registry, Thunderbird's prefs.js and message filters (OSWorld's vlc.py, libreoffice.py and
thunderbird.py checks that read files)."""

from __future__ import annotations

import fnmatch
import json
import os
import re
from typing import Any
from urllib.parse import urlparse
from xml.etree import ElementTree

from cua_jax.tasks.metrics.base import (
    JudgeError,
    match_record,
    match_value,
    metric,
    read_text,
    rule,
)

# ------------------------------------------------------------------------------------
# VLC
# ------------------------------------------------------------------------------------


def vlcrc_value(text: str, marker: str, default: str) -> str:
    """The value after the last '=' of the last vlcrc line containing `marker` (commented
    default lines included, as OSWorld reads them), or `default`."""
    value = default
    for line in text.split("\n"):
        if marker in line:
            value = line.split("=")[-1].strip()
    return value


def _vlc_setting(config_path: Any, rules: dict, rule_key: str, marker: str, default: str) -> float:
    wanted = rule(rules, rule_key)
    text = read_text(config_path)
    if text is None:
        return 0.0
    return float(vlcrc_value(text, marker, default) == str(wanted))


@metric()
def check_qt_bgcone(config_path: str | None, rules: dict) -> float:
    """1 when vlcrc's qt-bgcone (default 1) is rules['expected_qt_bgcone']."""
    return _vlc_setting(config_path, rules, "expected_qt_bgcone", "qt-bgcone=", "1")


@metric()
def check_qt_max_volume(config_path: str | None, rules: dict) -> float:
    """1 when vlcrc's qt-max-volume (default 125) is rules['expected_qt_max_volume']."""
    return _vlc_setting(config_path, rules, "expected_qt_max_volume", "qt-max-volume=", "125")


@metric()
def check_qt_minimal_view(config_path: str | None, rules: dict) -> float:
    """1 when vlcrc's qt-minimal-view (default 0) is rules['expected_qt_minimal_view']."""
    return _vlc_setting(config_path, rules, "expected_qt_minimal_view", "qt-minimal-view=", "0")


@metric()
def check_one_instance_when_started_from_file(config_path: str | None, rules: dict) -> float:
    """1 when vlcrc's one-instance-when-started-from-file (default 1) is the expected value."""
    return _vlc_setting(
        config_path, rules, "expected_one_instance_when_started_from_file", "one-instance-when-started-from-file=", "1"
    )


@metric()
def check_play_and_exit(config_path: str | None, rules: dict) -> float:
    """1 when vlcrc's play-and-exit (default 0) is rules['expected_play_and_exit']."""
    return _vlc_setting(config_path, rules, "expected_play_and_exit", "play-and-exit=", "0")


@metric()
def check_global_key_play_pause(config_path: str | None, rules: dict) -> float:
    """1 when whether a global play/pause key is set in vlcrc ("1" set, "0" empty or
    absent) is rules['expected_global_key_play_pause']."""
    wanted = str(rule(rules, "expected_global_key_play_pause"))
    text = read_text(config_path)
    if text is None:
        return 0.0
    state = "0"
    for line in text.split("\n"):
        if "global-key-play-pause=" in line:
            state = "0" if line.split("=")[-1].strip() == "" else "1"
    return float(state == wanted)


_DEFAULT_SLIDER = "153;210;153;20;210;20;255;199;15;245;39;29"


@metric()
def check_qt_slider_colours(config_path: str | None, rules: dict) -> float:
    """vlcrc's qt-slider-colours: rules {"type": "match", "expected_qt_slider_colours": s}
    compares the string; {"type": "blackish"} needs every RGB triple below 100."""
    kind = rule(rules, "type")
    if kind not in ("match", "blackish"):
        raise JudgeError(f"check_qt_slider_colours rule type {kind!r} is not 'match' or 'blackish'")
    wanted = rule(rules, "expected_qt_slider_colours") if kind == "match" else None
    text = read_text(config_path)
    if text is None:
        return 0.0
    colours = vlcrc_value(text, "qt-slider-colours", _DEFAULT_SLIDER)
    if kind == "match":
        return float(colours == wanted)
    try:
        values = [int(v) for v in colours.split(";")]
    except ValueError:
        return 0.0
    return float(all(v < 100 for v in values[: len(values) // 3 * 3]))


@metric()
def is_vlc_recordings_folder(config_path: str | None, rules: dict) -> float:
    """1 when the first uncommented vlcrc input-record-path line names
    rules['recording_file_path']."""
    wanted = rule(rules, "recording_file_path")
    text = read_text(config_path)
    if text is None:
        return 0.0
    for line in text.split("\n"):
        if line.startswith("#") or not line.strip():
            continue
        if "input-record-path" in line:
            return float(line.split("=")[-1].strip() == wanted)
    return 0.0


_FILE_INFO = ("filename", "title", "uri", "location", "name")
_URL_INFO = (
    'category[@name="meta"]/info[@name="url"]',
    'category[@name="meta"]/info[@name="URI"]',
    'category[@name="meta"]/info[@name="location"]',
    'category[@name="meta"]/info[@name="title"]',
    'category[@name="meta"]/info[@name="filename"]',
    'category[@name="Stream 0"]/info[@name="Codec"]',
    'category[@name="Stream 0"]/info[@name="Type"]',
    'category[@name="Stream 0"]/info[@name="Language"]',
)


@metric()
def is_vlc_playing(status_path: str | None, rules: dict) -> float:
    """1 when VLC's status XML says "playing" and the playing media matches: rules
    {"type": "file_name", "file_name": name} (the media's base name is, or its path ends
    with, the name) or {"type": "url", "url": url} (the media information contains the
    URL, is its file name, or is a URL of the same host containing its path)."""
    kind = rule(rules, "type")
    if kind not in ("file_name", "url"):
        raise JudgeError(f"is_vlc_playing rule type {kind!r} is not 'file_name' or 'url'")
    wanted = rule(rules, kind)
    text = read_text(status_path)
    if text is None:
        return 0.0
    try:
        tree = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return 0.0
    state = tree.find("state")
    if state is None or state.text != "playing":
        return 0.0
    paths = (
        [f'information/category[@name="meta"]/info[@name="{n}"]' for n in _FILE_INFO]
        if kind == "file_name"
        else [f"information/{p}" for p in _URL_INFO]
    )
    info = next((e.text for e in (tree.find(p) for p in paths) if e is not None and e.text), None)
    if info is None:
        return 0.0
    if kind == "file_name":
        return float(os.path.basename(info) == wanted or info.endswith(wanted))
    if wanted in info or info == os.path.basename(urlparse(wanted).path):
        return 1.0
    if "://" in info:
        expected, actual = urlparse(wanted), urlparse(info)
        return float(expected.netloc == actual.netloc and expected.path in actual.path)
    return 0.0


@metric()
def is_vlc_fullscreen(window_size: Any, screen_size: Any) -> float:
    """1 when the window size ({"width", "height"}) equals the screen size."""
    if not isinstance(window_size, dict) or not isinstance(screen_size, dict):
        return 0.0
    return float(
        window_size.get("width") == screen_size.get("width") and window_size.get("height") == screen_size.get("height")
    )


# ------------------------------------------------------------------------------------
# LibreOffice
# ------------------------------------------------------------------------------------

_OOR = "http://openoffice.org/2001/registry"


@metric()
def check_libre_locale(config_path: str | None, rules: dict) -> float:
    """1 when LibreOffice's locale (registry L10N ooSetupSystemLocale, else ooLocale)
    matches one of the shell patterns rules['locale_set']."""
    patterns = rule(rules, "locale_set")
    text = read_text(config_path)
    if text is None:
        return 0.0
    try:
        root = ElementTree.fromstring(text)
    except ElementTree.ParseError:
        return 0.0
    found: dict[str, str] = {}
    for item in root.iter("item"):
        if not (item.get(f"{{{_OOR}}}path") or "").endswith("L10N"):
            continue
        for prop in item.findall("prop"):
            name, value = prop.get(f"{{{_OOR}}}name"), prop.find("value")
            if name in ("ooSetupSystemLocale", "ooLocale") and value is not None and name not in found:
                found[name] = value.text or ""
    locale = found.get("ooSetupSystemLocale", found.get("ooLocale"))
    return float(locale is not None and any(fnmatch.fnmatchcase(locale, p) for p in patterns))


# ------------------------------------------------------------------------------------
# Thunderbird
# ------------------------------------------------------------------------------------

_PREF = re.compile(r'^user_pref\("(?P<key>(?:[^"]|\\")+)", (?P<val>.+)\);$')


@metric()
def check_thunderbird_prefs(prefs_path: str | None, rules: dict) -> float:
    """1 when every pref of rules['expect'] ({name: value rule}) is set in prefs.js and
    meets its rule, and no pref of rules['unexpect'] meets its rule."""
    if not isinstance(rules, dict):
        raise JudgeError(f"check_thunderbird_prefs needs rules with 'expect' / 'unexpect', got {rules!r}")
    expect, unexpect = rules.get("expect", {}), rules.get("unexpect", {})
    text = read_text(prefs_path)
    if text is None:
        return 0.0
    met = {key: False for key in expect}
    clean = True
    for line in text.splitlines():
        match = _PREF.match(line.strip())
        if match is None:
            continue
        key = match.group("key")
        try:
            value = json.loads(match.group("val"))
        except ValueError:
            continue
        if key in expect:
            met[key] = match_value(value, expect[key])
        elif key in unexpect:
            clean = clean and not match_value(value, unexpect[key])
    return float(all(met.values()) and clean)


_CONDITION = re.compile(r"\b(?:AND|OR) \((?:[\w ]+),(?:[\w ']+),(?:\"(?:(?:[^\"]|\")+)\"|(?:[^)]+))\)|\bALL\b")


def _filter_value(line: str) -> str:
    value = line.rstrip("\r\n").split("=", 1)[1]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return value.replace('\\"', '"').replace("\\\\", "\\")


def thunderbird_filters(text: str) -> list[dict[str, Any]]:
    """The filters of a msgFilterRules.dat: name, enabled, type, action, actionValue and
    the list of conditions ("AND (subject,contains,x)", "ALL", ...)."""
    filters, current = [], {}
    for line in text.splitlines():
        key = line.split("=", 1)[0]
        if key == "name":
            current = {"name": _filter_value(line)}
        elif key in ("enabled", "type", "action", "actionValue"):
            current[key] = _filter_value(line)
        elif key == "condition":
            current["condition"] = _CONDITION.findall(_filter_value(line))
            filters.append(current)
    return filters


@metric()
def check_thunderbird_filter(filters_path: str | None, rules: dict) -> float:
    """1 when every rules['expect'] record matches some filter and no rules['unexpect']
    record matches any."""
    if not isinstance(rules, dict):
        raise JudgeError(f"check_thunderbird_filter needs rules with 'expect' / 'unexpect', got {rules!r}")
    text = read_text(filters_path)
    if text is None:
        return 0.0
    filters = thunderbird_filters(text)
    found = all(any(match_record(pattern, f) for f in filters) for pattern in rules.get("expect", []))
    return float(found and not any(match_record(pattern, f) for pattern in rules.get("unexpect", []) for f in filters))
