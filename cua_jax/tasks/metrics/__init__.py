"""Every metric a task can name: OSWorld's evaluators on standard libraries, and this
project's Python judge.

METRICS maps a metric name to a `Metric(fn, arity, required, needs)`: the function, how
many getter values it takes (result, expected), how many a task must name, and the
judge-side inputs it needs (the last action, the environment client). Metric functions
follow OSWorld's conventions and options: `fn(result, expected, **options)` (or
`fn(result, **options)` for one getter value), returning a float in [0, 1].

KNOWN_UNIMPLEMENTED names every other metric OSWorld's task files use, with the reason it
is not implemented here, so a task naming one parses (and its judging raises JudgeError,
quarantining the task, instead of a wrong score).

OSWorld's empty func string ("") is not a metric: it marks draft task files whose
evaluator was never written (their result / expected getters are empty too). OSWorld
cannot load such a task (its metric look-up fails) and none is in its test sets, so the
task schema rejects it ("must name at least one metric"); it is neither registered nor
listed here (EMPTY_FUNC_MEANING says so for error messages).

Modules, by what they compare: text (strings, text files), data (JSON / YAML, CSV,
SQLite), sheets (spreadsheets: compare_table and its rules), documents (.docx, .odt,
EPUB), slides (.pptx, Impress settings), pdf, images, general (os and multi_apps checks,
archives, HTML, infeasible, python_judge), apps (VLC, LibreOffice and Thunderbird files),
browser (Chrome's state as OSWorld's Chrome getters return it).
"""

from __future__ import annotations

import difflib

from cua_jax.tasks.metrics.base import CONTEXT_INPUTS, METRICS, JudgeError, Metric, match_value, metric

# Importing the modules registers their metrics.
from cua_jax.tasks.metrics import (  # noqa: F401  isort: skip
    text,
    data,
    sheets,
    documents,
    slides,
    pdf,
    images,
    general,
    apps,
    browser,
)

_REGISTERED_DOMAIN = (
    "compares URLs by registered domain with tldextract's public-suffix list, which is not available here"
)

KNOWN_UNIMPLEMENTED: dict[str, str] = {
    **{name: _REGISTERED_DOMAIN for name in ("is_expected_tabs", "is_expected_active_tab", "is_cookie_deleted")},
    "compare_pdf_images": "needs PyMuPDF (images embedded in a PDF) and imagehash (perceptual hashes)",
    "compare_image_text": "needs OCR (easyocr)",
    "compare_audios": "needs librosa (audio features and dynamic time warping)",
    "compare_videos": "needs OpenCV (video decoding)",
    "compare_triangle_positions": "needs OpenCV (contours and image moments)",
    "check_mp3_meta": "needs mutagen (ID3 tags)",
    "check_python_file_by_test_suite": "runs task-supplied Python on the judging host; use python_judge, "
    "which runs inside the environment",
    "check_python_file_by_gold_file": "an empty stub in OSWorld (it returns no score)",
    "get_unique_train_ids": "a helper of check_no_duplicates exported by OSWorld, not a metric (returns a tuple)",
    "check_thunderbird_folder": "OSWorld's version discards every non-empty message before comparing, so it "
    "cannot tell folders apart; its intent needs a specification",
    "contains_mp4_video": "used by one OSWorld task but defined by none of OSWorld's metric modules",
}

EMPTY_FUNC_MEANING = (
    "an empty metric name marks an OSWorld draft task without an evaluator "
    "(in none of OSWorld's test sets; OSWorld cannot load it)"
)

_overlap = set(KNOWN_UNIMPLEMENTED) & set(METRICS)
assert not _overlap, f"metrics both implemented and listed as unimplemented: {sorted(_overlap)}"


def lookup(name: str) -> Metric:
    """The registered metric `name`; JudgeError for a known but unimplemented one (with
    its reason) or an unknown name."""
    if name in METRICS:
        return METRICS[name]
    if name == "":
        raise JudgeError(f"no metric: {EMPTY_FUNC_MEANING}")
    if name in KNOWN_UNIMPLEMENTED:
        raise JudgeError(f"metric {name!r} is not implemented here: {KNOWN_UNIMPLEMENTED[name]}")
    close = difflib.get_close_matches(str(name), list(METRICS) + list(KNOWN_UNIMPLEMENTED), n=3)
    hint = f"; did you mean {', '.join(close)}?" if close else f"; known: {sorted(METRICS)}"
    raise JudgeError(f"unknown metric {name!r}{hint}")


def is_judgeable(name: str) -> bool:
    """Whether a task naming metric `name` can be judged here."""
    return name in METRICS


__all__ = [
    "CONTEXT_INPUTS",
    "EMPTY_FUNC_MEANING",
    "KNOWN_UNIMPLEMENTED",
    "METRICS",
    "JudgeError",
    "Metric",
    "is_judgeable",
    "lookup",
    "match_value",
    "metric",
]
