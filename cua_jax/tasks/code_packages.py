"""The repositories of the code suite: which files bugs go into, which tests judge them, and why
each package was chosen.

Their source distributions are pinned by version and sha256 in
launch/images/code/pip-sdists.txt and unpacked to /opt/repos/<name> in the `code` image. What
they share: pure Python, no runtime dependencies, a test suite shipped in the sdist that needs
nothing but pytest and runs in seconds (the judge runs all of it), stable for years, widely
used (so a policy may have seen the code, as it would in real maintenance work).
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class CodePackage:
    name: str  # the folder under /opt/repos
    version: str
    sources: tuple[str, ...]  # files bugs are injected into, relative to the repository
    test_files: tuple[str, ...]  # what pytest runs (files or folders)
    why: str


PACKAGES = {
    p.name: p
    for p in (
        CodePackage(
            "more-itertools",
            "10.5.0",
            ("more_itertools/more.py", "more_itertools/recipes.py"),
            ("tests",),
            "iterator algorithms with exact expected outputs: off-by-one and operator bugs show as wrong "
            "sequences; ~660 tests in under 2 s",
        ),
        CodePackage(
            "toolz",
            "1.0.0",
            ("toolz/itertoolz.py", "toolz/functoolz.py", "toolz/dicttoolz.py", "toolz/recipes.py"),
            ("toolz/tests",),
            "functional utilities (curry, merge, partition, sliding windows): small functions each with focused tests",
        ),
        CodePackage(
            "inflection",
            "0.5.1",
            ("inflection/__init__.py",),
            ("test_inflection.py",),
            "string inflection rules (pluralize, camelize, ordinal) with ~450 parametrized cases: "
            "a one-module package where a bug must be found by reading regex rules and branches",
        ),
        CodePackage(
            "six",
            "1.16.0",
            ("six.py",),
            ("test_six.py",),
            "the Python 2/3 compatibility module: one file, lazy module moves, metaclass and "
            "iteration helpers, ~200 tests",
        ),
        CodePackage(
            "cachetools",
            "5.5.0",
            ("src/cachetools/__init__.py", "src/cachetools/func.py", "src/cachetools/keys.py"),
            ("tests",),
            "cache classes (LRU, LFU, TTL, RR) whose eviction order and sizes the tests pin down: "
            "comparison and arithmetic bugs change observable state; src layout",
        ),
        CodePackage(
            "parse",
            "1.20.2",
            ("parse.py",),
            ("tests",),
            "the reverse of str.format: a format-spec parser with many branches and constants "
            "(alignment, widths, date formats); one module",
        ),
    )
}
