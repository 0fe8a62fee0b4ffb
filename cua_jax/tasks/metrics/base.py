"""What every metric module shares: the registry, the error a broken judge raises, rule
matching and the readers that tell an agent's missing file from a judge's missing file.

Conventions (OSWorld's): a metric is `fn(result, expected, **options) -> float in [0, 1]`,
called with the getter values in order; one that takes a single getter value is
`fn(result, **options)`. A result the agent failed to produce (None, a missing file, or
one malformed in its format: `is_parse_error`) scores 0; a malformed one is logged and noted
for the verdict (`noting_malformed_results`). Anything wrong on the judge's side
(a missing expected file, rules without a required key, an unknown option value) raises
JudgeError, so the task is quarantined instead of scored; any other error of a metric is a
bug, which the judge reports as a JudgeError with its traceback.
"""

from __future__ import annotations

import builtins
import contextlib
import contextvars
import dataclasses
import functools
import logging
import math
import operator
import pathlib
import re
from collections.abc import Callable, Iterator
from typing import Any

from cua_jax.envs.container_judge import JudgeError, JudgeTamperedError  # noqa: F401  the metrics raise them too
from cua_jax.registry import Registry

log = logging.getLogger(__name__)

# Judge-side inputs a metric may ask for by keyword (Metric.needs), besides getter values.
# judge: what runs judge code in the environment (`general.run_python_judge`).
CONTEXT_INPUTS = ("last_action", "client", "judge", "evaluator")


@dataclasses.dataclass(frozen=True)
class Metric:
    """One registered metric.

    fn: the comparison, `fn(*getter_values, **options, **context)`.
    arity: how many getter values it takes, in order (result, expected): 0, 1 or 2.
    required: how many of those a task must name (OSWorld's compare_table, for one, runs
        on the result alone when its rules need no expected workbook); defaults to arity.
    needs: judge-side inputs passed by keyword (CONTEXT_INPUTS), e.g. the last action.
    """

    fn: Callable[..., float]
    arity: int
    required: int | None = None
    needs: tuple[str, ...] = ()

    def __post_init__(self):
        if self.arity not in (0, 1, 2):
            raise ValueError(f"a metric takes 0, 1 or 2 getter values, not {self.arity}")
        if self.required is None:
            object.__setattr__(self, "required", self.arity)
        if not 0 <= self.required <= self.arity:
            raise ValueError(f"required getter values must be in [0, {self.arity}], got {self.required}")
        unknown = set(self.needs) - set(CONTEXT_INPUTS)
        if unknown:
            raise ValueError(f"unknown metric inputs {sorted(unknown)}; known: {CONTEXT_INPUTS}")


METRICS: Registry[Metric] = Registry("metric")


def metric(
    name: str | None = None, *, arity: int = 2, required: int | None = None, needs: tuple[str, ...] = ()
) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Register the decorated function as a metric (under its own name unless `name`)."""

    def add(fn: Callable[..., float]) -> Callable[..., float]:
        METRICS.register(name or fn.__name__)(Metric(fn, arity, required, needs))
        return fn

    return add


# ------------------------------------------------------------------------------------
# Rules and files
# ------------------------------------------------------------------------------------


def rule(rules: Any, key: str) -> Any:
    """rules[key]; JudgeError when the rules are not a dict holding it."""
    if not isinstance(rules, dict) or key not in rules:
        raise JudgeError(f"the expected rules need '{key}', got {rules!r}")
    return rules[key]


def result_file(path: Any) -> str | None:
    """The agent's file when it exists, else None (the metric then scores 0)."""
    if not isinstance(path, (str, pathlib.Path)) or not path or not pathlib.Path(path).is_file():
        return None
    return str(path)


def expected_file(path: Any, what: str = "expected file") -> str:
    """The judge's file; JudgeError when it is missing."""
    if not isinstance(path, (str, pathlib.Path)) or not path or not pathlib.Path(path).is_file():
        raise JudgeError(f"{what} {path!r} is missing")
    return str(path)


def read_text(path: Any) -> str | None:
    """A text file's content (undecodable bytes replaced), or None when it is missing."""
    local = result_file(path)
    if local is None:
        return None
    return pathlib.Path(local).read_text(encoding="utf-8", errors="replace")


def read_expected_text(path: Any, what: str = "expected file") -> str:
    return pathlib.Path(expected_file(path, what)).read_text(encoding="utf-8", errors="replace")


def load_expected(loader: Callable[[str], Any], path: Any, what: str) -> Any:
    """Parse a judge-side file; JudgeError (not a score) when it is missing or unreadable."""
    local = expected_file(path, what)
    try:
        return loader(local)
    except Exception as error:  # noqa: BLE001 - any parser failure of the judge's own file
        raise JudgeError(f"cannot read {what} {local}: {type(error).__name__}: {error}") from None


class MalformedFileError(ValueError):
    """A file that is not valid in its format, found by this package's own readers."""


@functools.cache
def _format_readers(file_format: str) -> tuple[tuple[type[BaseException], ...], tuple[str, ...]]:
    """(error types, reader modules) of a file format: what `is_parse_error` accepts."""
    import zipfile
    import zlib
    from xml.etree import ElementTree

    from lxml import etree

    xml = (
        (etree.XMLSyntaxError, etree.ParserError, ElementTree.ParseError, MalformedFileError),
        ("lxml", "xml.etree", "xml.parsers"),
    )
    archive = ((zipfile.BadZipFile, zlib.error, *xml[0]), ("zipfile", "zlib", *xml[1]))
    if file_format == "xml":
        return xml
    if file_format == "zip":
        return archive
    if file_format == "table":  # sheets.read_table: csv, or xlsx read as zipped XML
        import csv

        return (csv.Error, *archive[0]), archive[1]
    if file_format == "docx":
        from docx.opc.exceptions import OpcError

        return (OpcError, *archive[0]), ("docx", *archive[1])
    if file_format == "pptx":
        from pptx.exc import PythonPptxError

        return (PythonPptxError, *archive[0]), ("pptx", *archive[1])
    if file_format == "xlsx":
        from openpyxl.utils.exceptions import InvalidFileException

        return (InvalidFileException, *archive[0]), ("openpyxl", *archive[1])
    if file_format == "image":
        from PIL import UnidentifiedImageError

        return (UnidentifiedImageError,), ("PIL",)
    if file_format == "pdf":
        from pypdf.errors import PyPdfError

        return (PyPdfError,), ("pypdf",)
    raise ValueError(
        f"no parse errors known for file format {file_format!r}; known: xml, zip, table, docx, pptx, xlsx, image, pdf"
    )


def _raised_in(error: BaseException, modules: tuple[str, ...]) -> bool:
    """Whether the innermost frame of `error`'s traceback runs code of one of `modules`."""
    frame = error.__traceback__
    if frame is None:
        return False
    while frame.tb_next is not None:
        frame = frame.tb_next
    name = frame.tb_frame.f_globals.get("__name__") or ""
    return any(name == module or name.startswith(module + ".") for module in modules)


def is_parse_error(error: BaseException, file_format: str) -> bool:
    """Whether `error` says a file is malformed in `file_format`: one of the format's own
    error types, or any error raised inside its readers (the format's library, zipfile, the
    XML parsers), which report malformed input with KeyError, TypeError, AttributeError and
    the like too. The same errors raised by this package's own code are bugs, not malformed
    files (this package's readers raise MalformedFileError for those).

    Formats: docx, pptx, xlsx (python-docx, python-pptx, openpyxl), image (Pillow), pdf
    (pypdf), zip (a zip archive of XML parts), table (`sheets.read_table`: csv, or xlsx read
    as such an archive), xml.
    """
    types, modules = _format_readers(file_format)
    if isinstance(error, JudgeError):
        return False
    return isinstance(error, types) or _raised_in(error, modules)


# The notes of the verdict being reached (`noting_malformed_results`); None outside one.
_malformed_results: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("malformed_results", default=None)


@contextlib.contextmanager
def noting_malformed_results() -> Iterator[list[str]]:
    """Collects, while a judge reaches its verdict, a note for each of the agent's files found
    malformed (`note_malformed_result`). A metric returns its score alone, so the notes travel
    beside it to the verdict rather than through every metric's signature."""
    notes: list[str] = []
    token = _malformed_results.set(notes)
    try:
        yield notes
    finally:
        _malformed_results.reset(token)


def note_malformed_result(path: Any, error: BaseException) -> None:
    """Logs an agent's file malformed in its format (scored 0) and notes it for the verdict."""
    note = f"{path}: {type(error).__name__}: {error}"
    log.info("the agent's result file is malformed (scored 0): %s", note)
    notes = _malformed_results.get()
    if notes is not None:
        notes.append(note)


def load_result(loader: Callable[[str], Any], path: Any, file_format: str) -> Any:
    """Parse the agent's file; None when it is missing or malformed in `file_format` (a score
    of 0, see `is_parse_error`; a malformed one is noted, `note_malformed_result`). Any other
    error of the loader propagates: a judge's bug."""
    _format_readers(file_format)  # an unknown format fails here, not only on a malformed file
    local = result_file(path)
    if local is None:
        return None
    try:
        return loader(local)
    except Exception as error:
        if is_parse_error(error, file_format):
            note_malformed_result(local, error)
            return None
        raise


def option_choice(name: str, value: Any, choices: tuple) -> Any:
    if value not in choices:
        raise JudgeError(f"option {name}={value!r} is not one of {list(choices)}")
    return value


# ------------------------------------------------------------------------------------
# OSWorld's value rules: {"method": ..., "ref": ...}
# ------------------------------------------------------------------------------------

_ORDERINGS = {
    "eq": operator.eq,
    "ne": operator.ne,
    "le": operator.le,
    "lt": operator.lt,
    "ge": operator.ge,
    "gt": operator.gt,
}


def match_value(value: Any, value_rule: dict) -> bool:
    """Whether `value` satisfies OSWorld's rule {"method": m, "ref": r}.

    Methods: "re" or "re.FLAG.FLAG" (re.search with the named re flags); eq, ne, le, lt,
    ge, gt (operator on value and ref); "approx:T" (|float(value) - ref| <= T);
    "range.XY" with X, Y in {t, e} (ref[0] <X value <Y ref[1], t: strict, e: or equal);
    str_list_eq / str_set_eq (the comma-separated string value as a list / set equals
    ref); spreadsheet_range (ref [inner, outer]: inner ⊆ value ⊆ outer, cell ranges).
    A value of the wrong type for the method does not match; an unknown method or a
    malformed rule raises JudgeError.
    """
    if not isinstance(value_rule, dict) or not isinstance(value_rule.get("method"), str):
        raise JudgeError(f"a value rule needs a 'method' string, got {value_rule!r}")
    method, ref = value_rule["method"], value_rule.get("ref")
    if method == "re" or method.startswith("re."):
        flags = 0
        for name in method.split(".")[1:]:
            flag = getattr(re, name, None)
            if not isinstance(flag, re.RegexFlag):
                raise JudgeError(f"unknown regular-expression flag {name!r} in method {method!r}")
            flags |= flag
        if not isinstance(value, str):
            return False
        try:
            return re.search(ref, value, flags) is not None
        except (re.error, TypeError) as error:
            raise JudgeError(f"bad regular expression {ref!r}: {error}") from None
    if method in _ORDERINGS:
        try:
            return bool(_ORDERINGS[method](value, ref))
        except TypeError:
            return False
    if method.startswith("approx:"):
        try:
            threshold = float(method.split(":", 1)[1])
            reference = float(ref)
        except (TypeError, ValueError):
            raise JudgeError(f"method {method!r} needs a numeric threshold and ref, got ref {ref!r}") from None
        try:
            number = float(value)
        except (TypeError, ValueError):
            return False
        return abs(number - reference) <= threshold
    if method.startswith("range."):
        ends = method[len("range.") :]
        if len(ends) != 2 or set(ends) - {"t", "e"} or not (isinstance(ref, list) and len(ref) == 2):
            raise JudgeError(f"method {method!r} needs range.XY (X, Y in t/e) and a [low, high] ref, got {ref!r}")
        left, right = (operator.lt if end == "t" else operator.le for end in ends)
        try:
            return bool(left(ref[0], value) and right(value, ref[1]))
        except TypeError:
            return False
    if method in ("str_list_eq", "str_set_eq"):
        container = builtins.list if method == "str_list_eq" else builtins.set
        if not isinstance(value, str):
            return False
        if not isinstance(ref, list):
            raise JudgeError(f"method {method!r} needs a list ref, got {ref!r}")
        return container(value.strip("\"'").split(",")) == container(ref)
    if method == "spreadsheet_range":
        from openpyxl.worksheet.cell_range import MultiCellRange

        if not (isinstance(ref, list) and len(ref) == 2):
            raise JudgeError(f"method 'spreadsheet_range' needs ref [inner, outer], got {ref!r}")
        try:
            inner, outer, actual = MultiCellRange(ref[0]), MultiCellRange(ref[1]), MultiCellRange(str(value))
        except (ValueError, TypeError):
            return False
        return all(r in actual for r in inner) and all(r in outer for r in actual)
    raise JudgeError(f"unknown match method {method!r}")


def match_record(pattern: dict, record: dict) -> bool:
    """Every key of `pattern` is in `record` with an equal value."""
    return all(key in record and record[key] == value for key, value in pattern.items())


# ------------------------------------------------------------------------------------
# Small numeric helpers shared by several modules
# ------------------------------------------------------------------------------------


@functools.cache
def _fuzz():
    from rapidfuzz import fuzz

    return fuzz


def fuzzy_ratio(a: str, b: str) -> float:
    """rapidfuzz's normalised Indel similarity of two strings, in [0, 1]."""
    return _fuzz().ratio(a, b) / 100.0


def approximately_equal(a: float, b: float, tolerance: float) -> bool:
    """|a - b| / max(|a|, |b|) <= tolerance; equal values (zeros too) always match, and a
    zero never matches a nonzero value."""
    if a == b:
        return True
    if a == 0 or b == 0:
        return False
    return abs(a - b) / max(abs(a), abs(b)) <= tolerance


def clamp01(value: float) -> float:
    """value clipped into [0, 1] (NaN stays NaN for the judge to reject)."""
    if math.isnan(value):
        return value
    return min(1.0, max(0.0, value))
