"""PDF metrics (OSWorld's pdf.py, compare_pdfs and the PDF check of general.py) on pypdf."""

from __future__ import annotations

import json
import operator

from cua_jax.tasks.metrics.base import (
    JudgeError,
    fuzzy_ratio,
    load_expected,
    load_result,
    metric,
    read_expected_text,
    rule,
)


def _reader(path: str):
    from pypdf import PdfReader

    return PdfReader(path)


def pdf_text(path: str) -> str:
    """The extracted text of every page, concatenated."""
    return "".join(page.extract_text() or "" for page in _reader(path).pages)


def pdf_page_count(path: str) -> int:
    return len(_reader(path).pages)


_RELATIONS = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}


@metric()
def check_pdf_pages(pdf_path: str | None, rules: dict) -> float:
    """1 when the page count stands in rules['relation'] (eq, ne, lt, le, gt, ge) to
    rules['ref_value']."""
    relation, reference = rule(rules, "relation"), rule(rules, "ref_value")
    if relation not in _RELATIONS:
        raise JudgeError(f"check_pdf_pages relation {relation!r} is not one of {list(_RELATIONS)}")
    pages = load_result(pdf_page_count, pdf_path, "pdf")
    return float(pages is not None and _RELATIONS[relation](pages, reference))


@metric()
def compare_pdfs(result_paths: str | list | None, expected_paths: str | list) -> float:
    """The mean, over pairs of PDFs, of the similarity ratio of their (stripped) texts; an
    unreadable result counts 0."""
    if not isinstance(expected_paths, list):
        result_paths, expected_paths = [result_paths], [expected_paths]
    if not expected_paths:
        raise JudgeError("compare_pdfs needs at least one expected PDF")
    if not isinstance(result_paths, list):
        return 0.0
    total = 0.0
    for result_path, expected_path in zip(result_paths, expected_paths):
        expected = load_expected(pdf_text, expected_path, "expected PDF").strip()
        result = load_result(pdf_text, result_path, "pdf")
        if result is not None:
            total += fuzzy_ratio(result.strip(), expected)
    return total / len(expected_paths)


@metric()
def is_gold_text_included_in_pdf(pdf_path: str | None, gold_path: str | None) -> float:
    """1 when every value of the gold JSON object appears in the PDF's text."""
    try:
        gold = json.loads(read_expected_text(gold_path, "gold text file"))
    except ValueError as error:
        raise JudgeError(f"the gold text file is not JSON: {error}") from None
    if not isinstance(gold, dict):
        raise JudgeError("the gold text file must hold a JSON object")
    text = load_result(pdf_text, pdf_path, "pdf")
    return float(text is not None and all(str(value) in text for value in gold.values()))


def pdf_texts_similar(first: bytes, second: bytes, threshold: float) -> bool:
    """Whether two PDFs' texts have a difflib similarity ratio of at least `threshold`."""
    import difflib
    import io

    from pypdf import PdfReader

    def text(data: bytes) -> str:
        return "".join(page.extract_text() or "" for page in PdfReader(io.BytesIO(data)).pages)

    return difflib.SequenceMatcher(None, text(first), text(second)).ratio() >= threshold
