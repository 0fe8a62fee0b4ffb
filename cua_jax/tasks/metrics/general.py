"""Metrics of OSWorld's os and multi_apps domains (basic_os.py, general.py, gimp.py's config
check, chrome.py's and vscode.py's file comparisons), plus `infeasible` and this project's
`python_judge`."""

from __future__ import annotations

import ast
import datetime
import os
import pathlib
import secrets
import tarfile
import tempfile
import zipfile
from typing import TYPE_CHECKING, Any

from cua_jax.envs import actions as A
from cua_jax.tasks.metrics import data, documents, images, pdf, sheets, slides, text
from cua_jax.tasks.metrics.base import (
    JudgeError,
    JudgeTamperedError,
    expected_file,
    fuzzy_ratio,
    is_parse_error,
    metric,
    note_malformed_result,
    read_text,
    result_file,
    rule,
)
from cua_jax.tasks.metrics.pdf import pdf_texts_similar

if TYPE_CHECKING:
    pass

# ------------------------------------------------------------------------------------
# Command output and desktop state
# ------------------------------------------------------------------------------------


@metric()
def check_gnome_favorite_apps(apps_output: Any, rules: dict) -> float:
    """1 when gsettings' favourite-apps list (a Python-style list literal) holds exactly the
    apps of rules['expected'], in any order."""
    wanted = rule(rules, "expected")
    if not isinstance(apps_output, str):
        return 0.0
    try:
        apps = ast.literal_eval(apps_output.strip())
    except (ValueError, SyntaxError):
        return 0.0
    if not isinstance(apps, (list, tuple)):
        return 0.0
    return float(len(apps) == len(wanted) and set(apps) == set(wanted))


@metric(arity=1)
def is_utc_0(timedatectl_output: Any) -> float:
    """1 when the fourth line of `timedatectl` output (its time zone) ends in "+0000)"."""
    if not isinstance(timedatectl_output, str):
        return 0.0
    lines = timedatectl_output.split("\n")
    return float(len(lines) > 3 and lines[3].rstrip().endswith("+0000)"))


@metric(arity=1)
def check_text_enlarged(scaling_factor: Any) -> float:
    """1 when the text scaling factor is above 1."""
    try:
        return float(float(scaling_factor) > 1.0)
    except (TypeError, ValueError):
        return 0.0


@metric()
def check_moved_jpgs(directory_tree: Any, rules: dict) -> float:
    """1 when the directory listing ({"children": [{"name": ...}]}) holds exactly the files
    of rules['expected']."""
    wanted = rule(rules, "expected")
    if not isinstance(directory_tree, dict) or not isinstance(directory_tree.get("children"), list):
        return 0.0
    names = [node.get("name") for node in directory_tree["children"] if isinstance(node, dict)]
    return float(len(names) == len(wanted) and set(names) == set(wanted))


@metric()
def is_in_vm_clickboard(rules: dict, clipboard: Any) -> float:
    """1 when the clipboard text (the second getter value) contains rules['expected'] (a
    string, or every string of a list)."""
    wanted = rule(rules, "expected")
    if not isinstance(clipboard, str):
        return 0.0
    if isinstance(wanted, list):
        return float(all(str(item) in clipboard for item in wanted))
    return float(str(wanted) in clipboard)


@metric()
def check_config_status(config_path: str | None, rules: dict) -> float:
    """1 when a line "(key ... value)" of a GIMP-style config file has first word
    rules['key'] (or first two words, for a two-item key) and last word rules['value']."""
    key, value = rule(rules, "key"), rule(rules, "value")
    if not (isinstance(key, str) or (isinstance(key, list) and len(key) == 2)):
        raise JudgeError(f"check_config_status needs a key string or a [key, subkey] pair, got {key!r}")
    text = read_text(config_path)
    if text is None:
        return 0.0
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        items = line.strip().lstrip("(").rstrip(")\n").split()
        if not items:
            continue
        if isinstance(key, str) and items[0] == key and items[-1] == value:
            return 1.0
        if isinstance(key, list) and len(items) >= 2 and items[:2] == key and items[-1] == value:
            return 1.0
    return 0.0


@metric()
def check_file_exists(directory: Any, filename: Any) -> float:
    """1 when the file `filename` exists in `directory`."""
    if not directory or not filename:
        return 0.0
    return float(os.path.isfile(os.path.join(str(directory), str(filename))))


# The namespace prefixes of each platform's accessibility tree (under its own host): the ones all
# share, plus the platform's own.
_SHARED_NAMESPACE_PATHS = {
    "st": "state",
    "attr": "attributes",
    "cp": "component",
    "doc": "document",
    "txt": "text",
    "val": "value",
    "act": "action",
}
_ACCESSIBILITY_NAMESPACES = {
    osname: {
        key: f"https://accessibility.{osname}.example.org/ns/{path}"
        for key, path in {**_SHARED_NAMESPACE_PATHS, **own}.items()
    }
    for osname, own in (
        ("ubuntu", {"docattr": "document/attributes"}),
        ("windows", {"docattr": "document/attributes", "class": "class"}),
        ("macos", {"role": "role"}),
    )
}


@metric()
def check_accessibility_tree(tree: Any, rules: list, osname: str = "ubuntu") -> float:
    """The product over rules of how well the accessibility tree (OSWorld's XML) matches
    each: elements selected by "xpath" (or CSS "selectors", which need the cssselect
    package); 0 when none; with "text", the best match of an element's text (exact, or the
    similarity ratio when "exact" is false)."""
    from lxml import etree

    if osname not in _ACCESSIBILITY_NAMESPACES:
        raise JudgeError(f"check_accessibility_tree osname {osname!r} is not one of {list(_ACCESSIBILITY_NAMESPACES)}")
    if not isinstance(rules, list):
        raise JudgeError(f"check_accessibility_tree needs a list of rules, got {rules!r}")
    namespaces = _ACCESSIBILITY_NAMESPACES[osname]
    if not isinstance(tree, str) or not tree:
        return 0.0
    try:
        root = etree.fromstring(tree.encode())
    except etree.XMLSyntaxError:
        return 0.0
    total = 1.0
    for item in rules:
        if not isinstance(item, dict):
            raise JudgeError(f"a check_accessibility_tree rule must be an object, got {item!r}")
        if "xpath" in item:
            try:
                elements = root.xpath(item["xpath"], namespaces=namespaces)
            except etree.XPathError as error:
                raise JudgeError(f"bad xpath {item['xpath']!r}: {error}") from None
        elif "selectors" in item:
            try:
                from lxml.cssselect import CSSSelector
            except ImportError:
                raise JudgeError(
                    "check_accessibility_tree CSS selectors need the cssselect package; use an xpath rule"
                ) from None
            elements = CSSSelector(", ".join(item["selectors"]), namespaces=namespaces)(root)
        else:
            raise JudgeError(f"a check_accessibility_tree rule needs 'xpath' or 'selectors', got {item!r}")
        if not elements:
            return 0.0
        if "text" in item:
            exact = item.get("exact", True)
            texts = [getattr(e, "text", None) for e in elements]
            if exact:
                score = max(float(t == item["text"]) for t in texts)
            else:
                score = max(fuzzy_ratio(item["text"], t or "") for t in texts)
            total *= score
    return total


_clock = datetime.datetime.now  # replaced in tests


@metric()
def compare_time_in_speedtest_results(result_path: str | None, time_diff: Any) -> float:
    """1 when the time (HH:MM, the end of the second field of the CSV's second line) is
    less than `time_diff` minutes from the current time of day."""
    try:
        limit = int(time_diff)
    except (TypeError, ValueError):
        raise JudgeError(
            f"compare_time_in_speedtest_results needs a whole number of minutes, got {time_diff!r}"
        ) from None
    text = read_text(result_path)
    if text is None:
        return 0.0
    lines = text.splitlines()
    try:
        stamp = datetime.datetime.strptime(lines[1].split(",")[1].strip()[-5:], "%H:%M")
    except (IndexError, ValueError):
        return 0.0
    now = datetime.datetime.strptime(_clock().strftime("%H:%M"), "%H:%M")
    return float(abs((stamp - now).total_seconds()) / 60 < limit)


# ------------------------------------------------------------------------------------
# Archives, HTML
# ------------------------------------------------------------------------------------


def unpack_archive(path: str, folder: str) -> None:
    """Unpack a zip or tar archive into `folder`, refusing members that would land outside
    it; ValueError when the file is neither."""
    root = pathlib.Path(folder).resolve()
    if zipfile.is_zipfile(path):
        with zipfile.ZipFile(path) as archive:
            for name in archive.namelist():
                target = (root / name).resolve()
                if target != root and root not in target.parents:
                    raise ValueError(f"archive member {name!r} would land outside the folder")
            archive.extractall(root)
    elif tarfile.is_tarfile(path):
        with tarfile.open(path) as archive:
            archive.extractall(root, filter="data")
    else:
        raise ValueError(f"{path} is not a zip or tar archive")


def _archive_comparison(file_type: str):
    functions = {
        "text": text.compare_text_file,
        "pdf": pdf.compare_pdfs,
        "docx": documents.compare_docx_files,
        "ppt": slides.compare_pptx_files,
        "image": images.compare_images,
        "csv": data.compare_csv,
        "table": sheets.compare_table,
    }
    if file_type not in functions:
        raise JudgeError(f"compare_archive compares files of type {sorted(functions)}, not {file_type!r}")
    return functions[file_type]


@metric()
def compare_archive(
    result_path: str | None, expected_path: str | None, file_path: str = "", file_type: str = "text", **options
) -> float:
    """Unpack both archives and compare the files of their folder `file_path`: 0 unless the
    file names agree, else the mean of compare_<file_type> over the files paired by name
    (text, pdf, docx, ppt, image, csv, table; further options go to that comparison)."""
    compare = _archive_comparison(file_type)
    gold = expected_file(expected_path, "expected archive")
    local = result_file(result_path)
    if local is None:
        return 0.0
    with tempfile.TemporaryDirectory() as workspace:
        result_folder, gold_folder = os.path.join(workspace, "result"), os.path.join(workspace, "gold")
        try:
            unpack_archive(gold, gold_folder)
        except (ValueError, OSError, zipfile.BadZipFile, tarfile.TarError) as error:
            raise JudgeError(f"cannot unpack the expected archive: {error}") from None
        try:
            unpack_archive(local, result_folder)
            result_files = sorted(os.listdir(os.path.join(result_folder, file_path)))
        except (ValueError, OSError, zipfile.BadZipFile, tarfile.TarError):
            return 0.0
        try:
            gold_files = sorted(os.listdir(os.path.join(gold_folder, file_path)))
        except OSError as error:
            raise JudgeError(f"the expected archive has no folder {file_path!r}: {error}") from None
        if result_files != gold_files:
            return 0.0
        if not result_files:
            return 1.0
        scores = [
            compare(os.path.join(result_folder, file_path, name), os.path.join(gold_folder, file_path, name), **options)
            for name in result_files
        ]
    return sum(scores) / len(scores)


@metric()
def compare_zip_files(result_path: str | None, expected_path: str | None, **_) -> float:
    """1 when two zip archives hold the same member names with the same bytes (PDF members:
    text similarity ratio at least 0.95)."""

    gold = expected_file(expected_path, "expected archive")
    local = result_file(result_path)
    if local is None:
        return 0.0
    try:
        with zipfile.ZipFile(local) as first, zipfile.ZipFile(gold) as second:
            if set(first.namelist()) != set(second.namelist()):
                return 0.0
            for name in first.namelist():
                a, b = first.read(name), second.read(name)
                if name.lower().endswith(".pdf"):
                    try:
                        if not pdf_texts_similar(a, b, 0.95):
                            return 0.0
                    except Exception as error:
                        if is_parse_error(error, "pdf"):
                            note_malformed_result(f"{local} ({name})", error)
                            return 0.0
                        raise
                elif a != b:
                    return 0.0
    except zipfile.BadZipFile:
        return 0.0
    return 1.0


def html_nodes(text: str) -> list[tuple]:
    """An HTML document's nodes in document order, as BeautifulSoup walks them: ("tag",
    name, stripped text, attributes) for elements, ("text", string) for text between them,
    ("comment", string) for comments."""
    import lxml.html
    from lxml import etree

    root = lxml.html.document_fromstring(text)
    nodes: list[tuple] = []

    def walk(element) -> None:
        if element.tag is etree.Comment:
            nodes.append(("comment", element.text or ""))
        elif isinstance(element.tag, str):
            nodes.append(("tag", element.tag, element.text_content().strip(), dict(element.attrib)))
            if element.text:
                nodes.append(("text", element.text))
            for child in element:
                walk(child)
                if child.tail:
                    nodes.append(("text", child.tail))

    walk(root)
    return nodes


@metric()
def compare_htmls(result_path: str | None, expected_path: str | None, ignore_sdnum: bool | None = None, **_) -> float:
    """1 when the two HTML documents' nodes agree pairwise in document order (tag names,
    stripped text, attributes (without sdnum when ignore_sdnum), text nodes); as in
    OSWorld, nodes past the shorter document are not compared."""
    try:
        expected = html_nodes(pathlib.Path(expected_file(expected_path, "expected HTML")).read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as error:
        raise JudgeError(f"cannot read the expected HTML: {error}") from None
    text = read_text(result_path)
    if text is None:
        return 0.0
    try:
        result = html_nodes(text)
    except ValueError:
        return 0.0
    for first, second in zip(result, expected):
        if first[0] != "tag" or second[0] != "tag":
            if first != second:
                return 0.0
            continue
        if first[1] != second[1] or first[2] != second[2]:
            return 0.0
        if first[3] != second[3]:
            if not ignore_sdnum:
                return 0.0
            if {k: v for k, v in first[3].items() if k != "sdnum"} != {
                k: v for k, v in second[3].items() if k != "sdnum"
            }:
                return 0.0
    return 1.0


@metric()
def check_html_background_image(html_path: str | None, rules: dict) -> float:
    """1 when a <style> of the HTML file sets background-image: url('rules[value]')."""
    import lxml.html

    value = rule(rules, "value")
    text = read_text(html_path)
    if not text:
        return 0.0
    try:
        root = lxml.html.document_fromstring(text)
    except ValueError:
        return 0.0
    wanted = f"background-image: url('{value}')"
    return float(any(wanted in style.text_content() for style in root.iter("style")))


# ------------------------------------------------------------------------------------
# Judged on the last action, or inside the environment
# ------------------------------------------------------------------------------------


@metric(arity=0, needs=("last_action",))
def infeasible(*_, last_action=None, **__) -> float:
    """1 when the agent declared the task infeasible (its last action is FAIL)."""
    return float(isinstance(last_action, A.Fail))


JUDGE_MARKER = "__cua_jax_judge_result__"  # then the run's nonce, ":", and the verdict

_JUDGE_RUNNER = """
import json as _json
{code}

_value = {entry}()
print({marker!r} + _json.dumps(float(_value)))
"""


def run_python_judge(runner: Any, code: str, entry: str, timeout: float) -> float:
    """Run judge code in the environment; its entry function returns a reward in [0, 1].

    runner: what runs Python there, `run_python(code, timeout) -> reply` (a desktop pool's
    `ContainerJudge`, apart from the agent; an `EnvClient`, through the environment's server).
    The verdict line carries a nonce fresh for this run and must be the only one: a second
    verdict was written by something else (JudgeTamperedError), and a judge that did not exit
    cleanly gave none."""
    marker = f"{JUDGE_MARKER}{secrets.token_hex(16)}:"
    reply = runner.run_python(_JUDGE_RUNNER.format(code=code, entry=entry, marker=marker), timeout=timeout)
    verdicts = [line[len(marker) :] for line in reply.get("output", "").splitlines() if line.startswith(marker)]
    if len(verdicts) > 1:
        raise JudgeTamperedError(f"the judge's output holds {len(verdicts)} verdicts; only one was the judge's")
    if not verdicts or reply.get("returncode", 0) != 0:
        raise JudgeError(
            f"the judge gave no result (exit {reply.get('returncode')}): "
            f"{(reply.get('message') or reply.get('error') or '')[-500:]}"
        )
    value = float(verdicts[0])
    if not 0.0 <= value <= 1.0:
        raise JudgeError(f"the judge returned {value}, not a reward in [0, 1]")
    return value


@metric(arity=0, needs=("judge", "evaluator"))
def python_judge(*, judge: Any, evaluator) -> float:
    """ScaleCUA's Python judge: `evaluator.code` defines `evaluator.entry`, a function of no
    arguments returning a reward in [0, 1], run in the environment with `evaluator.timeout`
    (never in this process) by `judge` (see run_python_judge)."""
    return run_python_judge(judge, evaluator.code, evaluator.entry, evaluator.timeout)
