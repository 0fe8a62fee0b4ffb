"""The template proposer: parametric task families of the desktop suite's applications.

Each family samples a spec (its parameters) and renders it deterministically into a
Candidate: instruction, setup config, Python judge (getter + metric, standard library
only, run inside the environment) and a reference solution in the action grammar.
Rendering from the spec is also how the programmatic fixer repairs a component.

Families (app):
    file_create (files)      create a file with given content in a directory
    file_append (files)      append a line to an existing file
    file_replace (files)     replace every occurrence of a word in a file
    term_rename (terminal)   rename a file with the terminal
    term_tree (terminal)     make a directory tree with the terminal
    editor_line (mousepad)   change one line in the open text editor and save
    sheet_value (gnumeric)   fill a cell of the open spreadsheet and save
    sheet_formula (gnumeric) enter a product formula in the open spreadsheet and save

`DEFECTS` are the mistakes an LLM proposer makes (ScaleCUA Table 4's failure sources);
`TemplateProposer(defect_rate=...)` injects them so the filtering roles have work.
"""

from __future__ import annotations

import hashlib
import json
import random
import shlex
from collections.abc import Callable
from typing import Any

from cua_jax.envs import actions as A
from cua_jax.tasks.verigen.candidate import Candidate, Part, judge_name

WORDS = (
    "amber",
    "basil",
    "cedar",
    "delta",
    "ember",
    "fjord",
    "garnet",
    "harbor",
    "indigo",
    "juniper",
    "kestrel",
    "lagoon",
    "maple",
    "nectar",
    "onyx",
    "pepper",
    "quartz",
    "raven",
    "saffron",
    "tundra",
    "umber",
    "violet",
    "willow",
    "xenon",
    "yarrow",
    "zephyr",
    "copper",
    "meadow",
    "silver",
    "thistle",
)
DIRS = ("/root/Documents", "/root/projects", "/root/notes", "/root/reports", "/root/archive", "/root/drafts")
ITEMS = ("apple", "pear", "plum", "kiwi", "mango", "lemon", "fig", "lime")
XTERM = ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "12"]
XTERM_READY = {
    "type": "execute",
    "parameters": {
        "command": "until xdotool search --onlyvisible --class XTerm 2>/dev/null; do sleep 0.1; done",
        "shell": True,
        "timeout": 60,
    },
}


def _texts(*actions: A.Action) -> list[str]:
    return [A.render_action(a) for a in actions]


def _spec_hash(family: str, spec: dict[str, Any]) -> str:
    return hashlib.sha256((family + json.dumps(spec, sort_keys=True)).encode()).hexdigest()[:10]


def write_file_step(path: str, lines: list[str]) -> dict[str, Any]:
    """A setup step that writes `lines` to `path` inside the environment (parents created)."""
    folder = path.rsplit("/", 1)[0] or "/"
    quoted = " ".join(shlex.quote(line) for line in lines)
    return {
        "type": "execute",
        "parameters": {
            "command": f"mkdir -p {shlex.quote(folder)} && printf '%s\\n' {quoted} > {shlex.quote(path)}",
            "shell": True,
        },
    }


def _lines_judge(name: str, path: str, expected: list[str]) -> str:
    return f"""import os

def {name}():
    path = {path!r}
    if not os.path.isfile(path):
        return 0.0
    with open(path, encoding="utf-8", errors="replace") as handle:
        lines = [line.rstrip() for line in handle.read().rstrip().splitlines()]
    return 1.0 if lines == {expected!r} else 0.0
"""


XLSX_READER = """import zipfile
from xml.etree import ElementTree

def _xlsx_cells(path):
    ns = "{http://schemas.openxmlformats.org/spreadsheetml/2006/main}"
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        shared = []
        if "xl/sharedStrings.xml" in names:
            root = ElementTree.fromstring(archive.read("xl/sharedStrings.xml"))
            shared = ["".join(t.text or "" for t in si.iter(ns + "t")) for si in root.iter(ns + "si")]
        sheet = sorted(n for n in names if n.startswith("xl/worksheets/sheet"))[0]
        root = ElementTree.fromstring(archive.read(sheet))
    cells = {}
    for cell in root.iter(ns + "c"):
        value, formula = cell.find(ns + "v"), cell.find(ns + "f")
        text = "" if value is None or value.text is None else value.text
        if cell.get("t") == "s" and text:
            text = shared[int(text)]
        elif cell.get("t") == "inlineStr":
            text = "".join(t.text or "" for t in cell.iter(ns + "t"))
        cells[cell.get("r")] = (text, None if formula is None else (formula.text or ""))
    return cells
"""


def _cell_judge(name: str, path: str, cell: str, number: float, formula_refs: tuple[str, ...] = ()) -> str:
    formula_check = ""
    if formula_refs:
        formula_check = (
            f"    if formula is None or not all(ref in formula.upper() for ref in {list(formula_refs)!r}):\n"
            f"        return 0.0\n"
        )
    return (
        XLSX_READER
        + f"""
def {name}():
    try:
        cells = _xlsx_cells({path!r})
    except (OSError, KeyError, IndexError, ValueError, zipfile.BadZipFile, ElementTree.ParseError):
        return 0.0
    text, formula = cells.get({cell!r}, ("", None))
{formula_check}    try:
        return 1.0 if abs(float(text) - {number!r}) < 1e-6 else 0.0
    except ValueError:
        return 0.0
"""
    )


# ------------------------------------------------------------------------------------
# Families: sample(rng) -> spec, render(spec) -> Candidate
# ------------------------------------------------------------------------------------


def _candidate(
    family: str,
    spec: dict[str, Any],
    app: str,
    instruction: str,
    config: list[dict],
    code: str,
    entry: str,
    solution: list[str],
    difficulty: str,
    stated: list[str],
) -> Candidate:
    task = {
        "id": f"verigen-{family}-{_spec_hash(family, spec)}",
        "snapshot": "desktop",
        "instruction": instruction,
        "source": f"verigen template {family}",
        "config": config,
        "related_apps": [app],
        "evaluator": {"func": "python_judge", "code": code, "entry": entry, "timeout": 20},
    }
    metadata = {
        "app": app,
        "family": family,
        "spec": spec,
        "difficulty": difficulty,
        "estimated_steps": len(solution),
        "augmentation": "template",
        "stated": stated,
    }
    return Candidate(task, solution, metadata, [Part(instruction, code, entry, 0, len(solution))])


def _sample_file_create(rng: random.Random) -> dict[str, Any]:
    words = rng.sample(WORDS, 3)
    return {
        "dir": rng.choice(DIRS),
        "name": f"{words[0]}_{words[1]}.txt",
        "content": f"{words[2]} {rng.randint(10, 999)}",
    }


def _render_file_create(spec: dict[str, Any]) -> Candidate:
    path = f"{spec['dir']}/{spec['name']}"
    entry = judge_name("files", "content", path + spec["content"])
    instruction = f"Create the file {path} whose only line is: {spec['content']}"
    return _candidate(
        "file_create",
        spec,
        "files",
        instruction,
        [{"type": "execute", "parameters": {"command": ["mkdir", "-p", spec["dir"]]}}],
        _lines_judge(entry, path, [spec["content"]]),
        entry,
        _texts(A.WriteFile(path, spec["content"] + "\n"), A.Done()),
        "easy",
        [path, spec["content"]],
    )


def _sample_file_append(rng: random.Random) -> dict[str, Any]:
    words = rng.sample(WORDS, 6)
    return {
        "path": f"{rng.choice(DIRS)}/{words[0]}.txt",
        "lines": [f"{w} = {rng.randint(1, 99)}" for w in words[1:4]],
        "new": f"{words[4]} = {rng.randint(100, 999)}",
    }


def _render_file_append(spec: dict[str, Any]) -> Candidate:
    path, lines, new = spec["path"], spec["lines"], spec["new"]
    entry = judge_name("files", "append", path + new)
    instruction = f"Append the line '{new}' to the end of {path}, keeping its existing lines."
    return _candidate(
        "file_append",
        spec,
        "files",
        instruction,
        [write_file_step(path, lines)],
        _lines_judge(entry, path, lines + [new]),
        entry,
        _texts(A.WriteFile(path, "\n".join(lines + [new]) + "\n"), A.Done()),
        "easy",
        [path, new],
    )


def _sample_file_replace(rng: random.Random) -> dict[str, Any]:
    old, new, *rest = rng.sample(WORDS, 6)
    lines = [f"{old} and {rest[0]}", f"{rest[1]} {rest[2]}", f"the {old} {rest[3]}"]
    return {"path": f"{rng.choice(DIRS)}/{rest[0]}_{rest[1]}.txt", "lines": lines, "old": old, "new": new}


def _render_file_replace(spec: dict[str, Any]) -> Candidate:
    path, old, new = spec["path"], spec["old"], spec["new"]
    expected = [line.replace(old, new) for line in spec["lines"]]
    entry = judge_name("files", "replace", path + old + new)
    instruction = f"In {path}, replace every occurrence of the word '{old}' with '{new}'."
    return _candidate(
        "file_replace",
        spec,
        "files",
        instruction,
        [write_file_step(path, spec["lines"])],
        _lines_judge(entry, path, expected),
        entry,
        _texts(A.WriteFile(path, "\n".join(expected) + "\n"), A.Done()),
        "easy",
        [path, old, new],
    )


def _terminal_solution(command: str) -> list[str]:
    return _texts(A.Click("left_click", 500, 500), A.Type(command + "\n"), A.Wait(1.0), A.Done())


def _sample_term_rename(rng: random.Random) -> dict[str, Any]:
    a, b, c = rng.sample(WORDS, 3)
    folder = rng.choice(DIRS)
    return {"src": f"{folder}/{a}.txt", "dst": f"{folder}/{b}.txt", "content": f"{c} {rng.randint(1, 999)}"}


def _render_term_rename(spec: dict[str, Any]) -> Candidate:
    src, dst = spec["src"], spec["dst"]
    entry = judge_name("terminal", "rename", src + dst)
    code = f"""import os

def {entry}():
    if os.path.exists({src!r}) or not os.path.isfile({dst!r}):
        return 0.0
    with open({dst!r}, encoding="utf-8", errors="replace") as handle:
        return 1.0 if handle.read().strip() == {spec["content"]!r} else 0.0
"""
    instruction = f"Using the terminal, rename the file {src} to {dst}."
    config = [
        write_file_step(src, [spec["content"]]),
        {"type": "launch", "parameters": {"command": XTERM}},
        XTERM_READY,
    ]
    return _candidate(
        "term_rename",
        spec,
        "terminal",
        instruction,
        config,
        code,
        entry,
        _terminal_solution(f"mv {src} {dst}"),
        "easy",
        [src, dst],
    )


def _sample_term_tree(rng: random.Random) -> dict[str, Any]:
    root, *subs = rng.sample(WORDS, 4)
    return {"root": f"/root/{root}", "subs": sorted(subs[:2]), "leaf": subs[2]}


def _render_term_tree(spec: dict[str, Any]) -> Candidate:
    dirs = [f"{spec['root']}/{sub}/{spec['leaf']}" for sub in spec["subs"]]
    entry = judge_name("terminal", "tree", ",".join(dirs))
    code = f"""import os

def {entry}():
    return 1.0 if all(os.path.isdir(path) for path in {dirs!r}) else 0.0
"""
    instruction = f"Using the terminal, create the directories {' and '.join(dirs)} (with their parents)."
    config = [{"type": "launch", "parameters": {"command": XTERM}}, XTERM_READY]
    return _candidate(
        "term_tree",
        spec,
        "terminal",
        instruction,
        config,
        code,
        entry,
        _terminal_solution("mkdir -p " + " ".join(dirs)),
        "medium",
        dirs,
    )


def _sample_editor_line(rng: random.Random) -> dict[str, Any]:
    words = rng.sample(WORDS, 5)
    values = rng.sample(range(1, 99), 5)
    lines = [f"{w} = {v}" for w, v in zip(words[:4], values)]
    return {"path": f"/root/{words[4]}.txt", "lines": lines, "line": rng.randint(2, 4), "value": values[4]}


def _render_editor_line(spec: dict[str, Any]) -> Candidate:
    path, k = spec["path"], spec["line"]
    old = spec["lines"][k - 1]
    new = f"{old.split(' = ')[0]} = {spec['value']}"
    expected = list(spec["lines"])
    expected[k - 1] = new
    entry = judge_name("mousepad", "line", path + new)
    name = path.rsplit("/", 1)[1]
    instruction = f"In the open text editor, change line {k} of {name} from '{old}' to '{new}' and save the file."
    config = [write_file_step(path, spec["lines"]), {"type": "open", "parameters": {"path": path}}]
    solution = _texts(
        A.Key(("ctrl", "home")),
        *[A.Key(("down",))] * (k - 1),
        A.Key(("shift", "end")),
        A.Type(new),
        A.Key(("ctrl", "s")),
        A.Wait(1.0),
        A.Done(),
    )
    return _candidate(
        "editor_line",
        spec,
        "mousepad",
        instruction,
        config,
        _lines_judge(entry, path, expected),
        entry,
        solution,
        "medium",
        [name, old, new],
    )


def _sample_sheet(rng: random.Random) -> dict[str, Any]:
    items = rng.sample(ITEMS, 4)
    rows = [[item, rng.randint(1, 9), rng.randint(1, 20)] for item in items]
    return {
        "path": f"/root/{rng.choice(WORDS)}_stock.xlsx",
        "rows": rows,
        "row": rng.randint(2, 5),
        "value": rng.randint(21, 99),
    }


def _sheet_config(spec: dict[str, Any], blank_row: int | None) -> list[dict[str, Any]]:
    csv_lines = ["item,price,qty"] + [
        f"{r[0]},{r[1]},{'' if i + 2 == blank_row else r[2]}" for i, r in enumerate(spec["rows"])
    ]
    csv_path = spec["path"][:-5] + ".csv"
    csv_path = "/tmp/" + csv_path.rsplit("/", 1)[1]
    return [
        write_file_step(csv_path, csv_lines),
        {"type": "execute", "parameters": {"command": ["ssconvert", csv_path, spec["path"]]}},
        {"type": "open", "parameters": {"path": spec["path"]}},
    ]


def _sheet_moves(row: int, column: int) -> list[A.Action]:
    return [A.Key(("ctrl", "home")), *[A.Key(("down",))] * (row - 1), *[A.Key(("right",))] * (column - 1)]


def _render_sheet_value(spec: dict[str, Any]) -> Candidate:
    row, value = spec["row"], spec["value"]
    item = spec["rows"][row - 2][0]
    name = spec["path"].rsplit("/", 1)[1]
    entry = judge_name("gnumeric", "cell", spec["path"] + f"C{row}={value}")
    instruction = (
        f"The spreadsheet {name} is open. The qty of {item} is missing: enter {value} in its qty "
        f"cell (C{row}) and save the file."
    )
    solution = _texts(*_sheet_moves(row, 3), A.Type(f"{value}\n"), A.Key(("ctrl", "s")), A.Wait(1.5), A.Done())
    return _candidate(
        "sheet_value",
        spec,
        "gnumeric",
        instruction,
        _sheet_config(spec, row),
        _cell_judge(entry, spec["path"], f"C{row}", float(value)),
        entry,
        solution,
        "medium",
        [name, str(value), f"C{row}"],
    )


def _render_sheet_formula(spec: dict[str, Any]) -> Candidate:
    row = spec["row"]
    item, price, qty = spec["rows"][row - 2]
    name = spec["path"].rsplit("/", 1)[1]
    entry = judge_name("gnumeric", "formula", spec["path"] + f"D{row}")
    instruction = (
        f"The spreadsheet {name} is open. In cell D{row}, enter a formula that multiplies the price "
        f"(B{row}) by the qty (C{row}) of {item}, then save the file."
    )
    solution = _texts(*_sheet_moves(row, 4), A.Type(f"=B{row}*C{row}\n"), A.Key(("ctrl", "s")), A.Wait(1.5), A.Done())
    return _candidate(
        "sheet_formula",
        spec,
        "gnumeric",
        instruction,
        _sheet_config(spec, None),
        _cell_judge(entry, spec["path"], f"D{row}", float(price * qty), (f"B{row}", f"C{row}")),
        entry,
        solution,
        "medium",
        [name, f"D{row}", f"B{row}", f"C{row}"],
    )


FAMILIES: dict[str, tuple[Callable[[random.Random], dict], Callable[[dict], Candidate]]] = {
    "file_create": (_sample_file_create, _render_file_create),
    "file_append": (_sample_file_append, _render_file_append),
    "file_replace": (_sample_file_replace, _render_file_replace),
    "term_rename": (_sample_term_rename, _render_term_rename),
    "term_tree": (_sample_term_tree, _render_term_tree),
    "editor_line": (_sample_editor_line, _render_editor_line),
    "sheet_value": (_sample_sheet, _render_sheet_value),
    "sheet_formula": (_sample_sheet, _render_sheet_formula),
}


def render(family: str, spec: dict[str, Any]) -> Candidate:
    """The candidate of a family's spec (the same spec always renders the same task)."""
    if family not in FAMILIES:
        raise ValueError(f"unknown task family {family!r} (families: {', '.join(FAMILIES)})")
    return FAMILIES[family][1](spec)


# ------------------------------------------------------------------------------------
# Defects: what an LLM proposer gets wrong
# ------------------------------------------------------------------------------------


def _swap_code(candidate: Candidate, code: str) -> Candidate:
    candidate.task["evaluator"]["code"] = code
    candidate.parts = [Part(p.instruction, code, p.entry, p.start, p.end) for p in candidate.parts]
    return candidate


def _defect_unstated_value(c: Candidate, rng: random.Random) -> Candidate:
    c.task["instruction"] = f"Make the needed change to the {c.metadata['app']} files so that the task is complete."
    return c


def _defect_nondeterministic(c: Candidate, rng: random.Random) -> Candidate:
    code = c.judge_code.replace(
        f"def {c.judge_entry}():",
        f"import random\n\ndef {c.judge_entry}():\n    if random.random() < 0.5:\n        return 1.0",
    )
    return _swap_code(c, code)


def _defect_judge_writes(c: Candidate, rng: random.Random) -> Candidate:
    code = c.judge_code.replace(
        f"def {c.judge_entry}():",
        f"def {c.judge_entry}():\n    with open('/tmp/judge_calls.log', 'a') as log:\n        log.write('called\\n')",
    )
    return _swap_code(c, code)


def _defect_wrong_path(c: Candidate, rng: random.Random) -> Candidate:
    return _swap_code(c, c.judge_code.replace("/root/", "/root/Desktop/", 1))


def _defect_unbounded_loop(c: Candidate, rng: random.Random) -> Candidate:
    code = c.judge_code.replace(f"def {c.judge_entry}():", f"def {c.judge_entry}():\n    while True:\n        pass")
    c.task["evaluator"]["timeout"] = 3
    return _swap_code(c, code)


DEFECTS: dict[str, Callable[[Candidate, random.Random], Candidate]] = {
    "unstated_value": _defect_unstated_value,
    "nondeterministic_judge": _defect_nondeterministic,
    "judge_writes": _defect_judge_writes,
    "wrong_path": _defect_wrong_path,
    "unbounded_loop": _defect_unbounded_loop,
}


class TemplateProposer:
    """Proposes candidates from the families (optionally with injected defects).

    Args:
        seed: the random seed; families: the families to draw from (all by default).
        defect_rate: the chance that a candidate carries one defect of `defects`.
    """

    name = "template"

    def __init__(
        self,
        seed: int = 0,
        families: tuple[str, ...] | None = None,
        defect_rate: float = 0.0,
        defects: tuple[str, ...] = tuple(DEFECTS),
        weights: dict[str, float] | None = None,
    ):
        unknown = sorted(set(families or ()) - set(FAMILIES)) + sorted(set(defects) - set(DEFECTS))
        if unknown:
            raise ValueError(f"unknown families or defects: {unknown}")
        if not 0.0 <= defect_rate <= 1.0:
            raise ValueError(f"defect_rate must be in [0, 1], got {defect_rate}")
        self.rng = random.Random(seed)
        self.families = tuple(families or FAMILIES)
        self.weights = [float((weights or {}).get(f, 1.0)) for f in self.families]
        self.defect_rate, self.defects = defect_rate, tuple(defects)
        self._seen: set[str] = set()

    def propose(self, n: int, knowledge: str = "", observation: str = "") -> list[Candidate]:
        """`n` new candidates, distinct from every one proposed before."""
        out = []
        while len(out) < n:
            family = self.rng.choices(self.families, self.weights)[0]
            candidate = render(family, FAMILIES[family][0](self.rng))
            if candidate.id in self._seen:
                continue
            self._seen.add(candidate.id)
            if self.defects and self.rng.random() < self.defect_rate:
                defect = self.rng.choice(self.defects)
                candidate = DEFECTS[defect](candidate, self.rng)
                candidate.metadata["injected_defect"] = defect
            out.append(candidate)
        return out
