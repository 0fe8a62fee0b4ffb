# Single job: the word-processor document metrics (docx, odt, epub).
"""Word-processor document metrics (OSWorld's docs.py) on python-docx; OpenDocument text
(.odt) and EPUB read straight from their zip archives with lxml."""

from __future__ import annotations

import io
import pathlib
import re
import zipfile
from typing import Any

from cua_jax.tasks.metrics.base import (
    JudgeError,
    clamp01,
    fuzzy_ratio,
    load_expected,
    load_result,
    metric,
    result_file,
    rule,
)
from cua_jax.tasks.metrics.measures import rgb_difference
from cua_jax.tasks.metrics.text import sequence_ratio

W = "http://schemas.openxmlformats.org/wordprocessingml/2006/main"


def _document(path: str):
    from docx import Document

    return Document(path)


def result_docx(path: Any):
    """The agent's .docx as a python-docx Document, or None when missing or unreadable."""
    return load_result(_document, path, "docx")


def expected_docx(path: Any):
    return load_expected(_document, path, "expected document")


def paired_runs(document, expected):
    """(run, run) at the same position of the same paragraph in both documents."""
    for first, second in zip(document.paragraphs, expected.paragraphs):
        yield from zip(first.runs, second.runs)


# ------------------------------------------------------------------------------------
# Paragraph text of .docx and .odt files
# ------------------------------------------------------------------------------------

_ODF_TEXT = "urn:oasis:names:tc:opendocument:xmlns:text:1.0"
_ODF_STYLE = "urn:oasis:names:tc:opendocument:xmlns:style:1.0"
_ODF_OFFICE = "urn:oasis:names:tc:opendocument:xmlns:office:1.0"
_ODF_FO = "urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0"


def _odt_content(path: str):
    from lxml import etree

    with zipfile.ZipFile(path) as archive:
        return etree.fromstring(archive.read("content.xml"))


def odt_paragraphs(path: str) -> list[str]:
    """The text of every text:p of an .odt file, in document order: its own text and
    that directly inside its text:span children (OSWorld's reading)."""
    span = f"{{{_ODF_TEXT}}}span"
    texts = []
    for paragraph in _odt_content(path).iter(f"{{{_ODF_TEXT}}}p"):
        parts = [paragraph.text or ""]
        for child in paragraph:
            if child.tag == span:
                parts.append(child.text or "")
                parts.extend(grandchild.tail or "" for grandchild in child)
            parts.append(child.tail or "")
        texts.append("".join(parts))
    return texts


def _paragraphs(path: str, kind: str) -> list[str]:
    if kind == ".docx":
        return [p.text for p in _document(path).paragraphs]
    return odt_paragraphs(path)


def _collapsed(paragraphs: list[str]) -> str:
    return re.sub(r"\s+", " ", "\n".join(paragraphs)).strip()


@metric()
def compare_docx_files(
    result_path: str | None,
    expected_path: str | None,
    ignore_blanks: bool = True,
    ignore_case: bool = False,
    ignore_order: bool = False,
    content_only: bool = False,
    fuzzy_match: bool = False,
    delete_empty_lines: bool = False,
    **_,
) -> float:
    """Compare the paragraph text of two .docx (or two .odt) documents.

    ignore_order sorts the paragraphs, delete_empty_lines drops blank ones. content_only:
    the similarity ratio of the whole texts (whitespace runs as one space). ignore_blanks
    (default): the whole texts, whitespace-collapsed, are equal (fuzzy_match: their
    similarity ratio). Otherwise paragraph by paragraph: equal counts and equal texts
    (fuzzy_match: the mean similarity ratio). ignore_case lowers the text throughout.
    Documents of different kinds score 0.
    """
    kind = pathlib.Path(str(expected_path)).suffix.lower()
    if kind not in (".docx", ".odt"):
        raise JudgeError(f"compare_docx_files reads .docx and .odt documents, not {expected_path!r}")
    expected = load_expected(lambda p: _paragraphs(p, kind), expected_path, "expected document")
    if result_file(result_path) is None or pathlib.Path(result_path).suffix.lower() != kind:
        return 0.0
    result = load_result(lambda p: _paragraphs(p, kind), result_path, "docx" if kind == ".docx" else "zip")
    if result is None:
        return 0.0
    if ignore_order:
        result, expected = sorted(result), sorted(expected)
    if delete_empty_lines:
        result, expected = [p for p in result if p.strip()], [p for p in expected if p.strip()]
    if ignore_case:
        result, expected = [p.lower() for p in result], [p.lower() for p in expected]
    if content_only or ignore_blanks:
        first, second = _collapsed(result), _collapsed(expected)
        if content_only or fuzzy_match:
            return fuzzy_ratio(first, second)
        return float(first == second)
    if len(result) != len(expected):
        return 0.0
    if fuzzy_match:
        if not result:
            return 1.0
        return sum(fuzzy_ratio(a, b) for a, b in zip(result, expected)) / len(result)
    return float(result == expected)


def _same_text(result_path: Any, expected_path: Any) -> bool:
    """OSWorld's precondition of several formatting checks: compare_docx_files with its
    default options gives 1."""
    return compare_docx_files(result_path, expected_path) == 1.0


@metric()
def compare_docx_files_and_ignore_new_lines(
    result_path: str | None, expected_path: str | None, ignore_blanks: bool = True, **_
) -> float:
    """compare_docx_files on .docx files after dropping empty paragraphs: the whitespace-
    collapsed texts are equal (ignore_blanks) or the paragraphs are."""
    expected = [p.text for p in expected_docx(expected_path).paragraphs if p.text != ""]
    document = result_docx(result_path)
    if document is None:
        return 0.0
    result = [p.text for p in document.paragraphs if p.text != ""]
    if ignore_blanks:
        return float(_collapsed(result) == _collapsed(expected))
    return float(result == expected)


@metric()
def compare_init_lines(result_path: str | None, expected_path: str | None) -> float:
    """1 when the paragraphs the two documents have in common positions are equal (the
    longer document's extra paragraphs are ignored)."""
    expected = expected_docx(expected_path)
    document = result_docx(result_path)
    if document is None:
        return 0.0
    return float(all(a.text == b.text for a, b in zip(document.paragraphs, expected.paragraphs)))


@metric()
def compare_docx_lines(result_path: str | None, expected_path: str | None) -> float:
    """1 when the two documents hold the same set of non-empty (stripped) paragraphs."""
    expected = expected_docx(expected_path)
    document = result_docx(result_path)
    if document is None:
        return 0.0

    def lines(doc) -> set[str]:
        return {p.text.strip() for p in doc.paragraphs if p.text.strip()}

    return float(lines(document) == lines(expected))


@metric()
def compare_docx_tables(result_path: str | None, expected_path: str | None) -> float:
    """1 when the documents have the same number of tables, each of the same shape with the
    same (stripped) cell texts."""
    expected = expected_docx(expected_path)
    document = result_docx(result_path)
    if document is None or len(document.tables) != len(expected.tables):
        return 0.0
    for first, second in zip(document.tables, expected.tables):
        if len(first.rows) != len(second.rows) or len(first.columns) != len(second.columns):
            return 0.0
        for i in range(len(first.rows)):
            for j in range(len(first.columns)):
                if first.cell(i, j).text.strip() != second.cell(i, j).text.strip():
                    return 0.0
    return 1.0


def _image_pixels(document) -> list[bytes]:
    from PIL import Image

    pixels = []
    for relation in document.part.rels.values():
        if "image" in relation.reltype:
            with Image.open(io.BytesIO(relation.target_part.blob)) as image:
                pixels.append(image.tobytes())
    return pixels


@metric()
def compare_docx_images(result_path: str | None, expected_path: str | None) -> float:
    """1 when the documents embed the same number of images with identical pixels."""
    expected = load_expected(lambda p: _image_pixels(_document(p)), expected_path, "expected document")
    result = load_result(lambda p: _image_pixels(_document(p)), result_path, "docx")
    return float(result is not None and result == expected)


@metric()
def compare_line_spacing(result_path: str | None, expected_path: str | None) -> float:
    """1 when the documents have the same text and every paragraph the same line spacing."""
    if not _same_text(result_path, expected_path):
        return 0.0
    document, expected = result_docx(result_path), expected_docx(expected_path)
    if document is None or len(document.paragraphs) != len(expected.paragraphs):
        return 0.0
    return float(
        all(
            a.paragraph_format.line_spacing == b.paragraph_format.line_spacing
            for a, b in zip(document.paragraphs, expected.paragraphs)
        )
    )


@metric()
def compare_insert_equation(result_path: str | None, expected_path: str | None) -> float:
    """1 when the documents have the same text and some run at the same position in both
    holds an embedded object (an equation)."""
    if not _same_text(result_path, expected_path):
        return 0.0
    document, expected = result_docx(result_path), expected_docx(expected_path)
    return float(
        any(
            run1.element.xpath(".//w:object") and run2.element.xpath(".//w:object")
            for run1, run2 in paired_runs(document, expected)
        )
    )


@metric()
def compare_font_names(result_path: str | None, rules: dict) -> float:
    """1 when every run of the document uses the font rules['font_name']."""
    font = rule(rules, "font_name")
    document = result_docx(result_path)
    if document is None:
        return 0.0
    return float(all(run.font.name == font for p in document.paragraphs for run in p.runs))


@metric()
def compare_subscript_contains(result_path: str | None, expected_path: str | None) -> float:
    """1 when some run at the same position in both documents is subscript."""
    expected = expected_docx(expected_path)
    document = result_docx(result_path)
    if document is None:
        return 0.0
    return float(any(run1.font.subscript and run2.font.subscript for run1, run2 in paired_runs(document, expected)))


@metric(arity=1)
def has_page_numbers_in_footers(result_path: str | None) -> float:
    """1 when the first footer paragraph of every section holds a digit."""
    document = result_docx(result_path)
    if document is None:
        return 0.0
    for section in document.sections:
        paragraphs = section.footer.paragraphs
        if not any(ch.isdigit() for ch in (paragraphs[0].text if paragraphs else "")):
            return 0.0
    return 1.0


@metric(arity=1)
def is_first_line_centered(result_path: str | None) -> float:
    """1 when the document's first paragraph is centred."""
    from docx.enum.text import WD_PARAGRAPH_ALIGNMENT

    document = result_docx(result_path)
    if document is None or not document.paragraphs:
        return 0.0
    return float(document.paragraphs[0].paragraph_format.alignment == WD_PARAGRAPH_ALIGNMENT.CENTER)


@metric()
def check_tabstops(
    result_path: str | None,
    expected_path: str | None,
    word_number_split_by_tabstop: int | None = None,
    index: int = 0,
    **_,
) -> float:
    """How closely the non-empty paragraphs' tab stops match: 0 when the paragraph counts,
    tab counts or tab alignments differ, else 1 minus the mean (over paragraphs) of the
    summed tab position differences relative to the expected text width. With
    word_number_split_by_tabstop = n, the result's `index`-th tab-separated part of every
    paragraph must hold n words."""
    from docx.enum.text import WD_TAB_ALIGNMENT

    expected = expected_docx(expected_path)
    document = result_docx(result_path)
    if document is None:
        return 0.0
    first = [p for p in document.paragraphs if p.text.strip()]
    second = [p for p in expected.paragraphs if p.text.strip()]
    if len(first) != len(second):
        return 0.0
    if word_number_split_by_tabstop is not None:
        for paragraph in first:
            parts = paragraph.text.split("\t")
            if not -len(parts) <= index < len(parts):
                return 0.0
            if len([w for w in re.split(r"\s", parts[index]) if w.strip()]) != word_number_split_by_tabstop:
                return 0.0
    if not first:
        return 1.0
    section = expected.sections[0]
    width = section.page_width - section.left_margin - section.right_margin

    def kept(paragraph):
        return [
            t
            for t in paragraph.paragraph_format.tab_stops
            if not (t.alignment == WD_TAB_ALIGNMENT.CLEAR or (t.alignment == WD_TAB_ALIGNMENT.LEFT and t.position == 0))
        ]

    penalty = 0.0
    for p1, p2 in zip(first, second):
        tabs1, tabs2 = kept(p1), kept(p2)
        if len(tabs1) != len(tabs2):
            return 0.0
        difference = 0.0
        for t1, t2 in zip(tabs1, tabs2):
            if t1.alignment != t2.alignment:
                return 0.0
            difference += abs(t1.position - t2.position)
        penalty += difference / width
    return clamp01(1 - penalty / len(first))


@metric()
def compare_contains_image(result_path: str | None, expected_path: str | None) -> float:
    """1 unless some run at the same position holds a drawing in one document only."""
    expected = expected_docx(expected_path)
    document = result_docx(result_path)
    if document is None:
        return 0.0
    return float(
        all(
            ("graphicData" in run1._element.xml) == ("graphicData" in run2._element.xml)
            for run1, run2 in paired_runs(document, expected)
        )
    )


@metric()
def evaluate_colored_words_in_tables(
    result_path: str | None, expected_path: str | None, threshold: float = 3.5, **_
) -> float:
    """1 when the documents have the same text and, in every table, words starting with a
    vowel are red and the others blue (CIEDE2000 difference at most `threshold`)."""
    if not _same_text(result_path, expected_path):
        return 0.0
    document = result_docx(result_path)
    for table in document.tables:
        for row in table.rows:
            for cell in row.cells:
                for paragraph in cell.paragraphs:
                    for run in paragraph.runs:
                        if not run.text:
                            continue
                        target = (255, 0, 0) if run.text[0].lower() in "aeiou" else (0, 0, 255)
                        color = run.font.color.rgb
                        if color is None or rgb_difference(tuple(color), target) > threshold:
                            return 0.0
    return 1.0


def odt_highlighted(path: str) -> bool:
    """Whether some text span of an .odt uses an automatic style with a yellow
    (#ffff00) background."""
    root = _odt_content(path)
    yellow = set()
    styles = root.find(f"{{{_ODF_OFFICE}}}automatic-styles")
    for style in styles if styles is not None else []:
        if any(child.get(f"{{{_ODF_FO}}}background-color") == "#ffff00" for child in style):
            yellow.add(style.get(f"{{{_ODF_STYLE}}}name"))
    return any(span.get(f"{{{_ODF_TEXT}}}style-name") in yellow for span in root.iter(f"{{{_ODF_TEXT}}}span"))


@metric()
def check_highlighted_words(result_path: str | None, expected_path: str | None) -> float:
    """1 when the .odt documents have the same text and the result has no yellow-highlighted
    span left."""
    if not _same_text(result_path, expected_path):
        return 0.0
    highlighted = load_result(odt_highlighted, result_path, "zip")
    return float(highlighted is False)


@metric()
def evaluate_strike_through_last_paragraph(result_path: str | None, expected_path: str | None) -> float:
    """1 when the documents have the same text and every run of the result's last paragraph
    is struck through."""
    if not _same_text(result_path, expected_path):
        return 0.0
    document = result_docx(result_path)
    if document is None or not document.paragraphs:
        return 0.0
    return float(all(run.font.strike for run in document.paragraphs[-1].runs))


@metric(arity=1)
def evaluate_conversion(result_path: str | None) -> float:
    """1 when no run of the document (tables included) is all upper case."""
    document = result_docx(result_path)
    if document is None:
        return 0.0
    paragraphs = [p for t in document.tables for row in t.rows for cell in row.cells for p in cell.paragraphs]
    paragraphs += list(document.paragraphs)
    return float(not any(run.text.isupper() for p in paragraphs for run in p.runs))


@metric(arity=1)
def evaluate_spacing(result_path: str | None) -> float:
    """1 when the first three paragraphs have line spacings 1.0, 2.0 and 1.5."""
    document = result_docx(result_path)
    if document is None or len(document.paragraphs) < 3:
        return 0.0
    spacings = [p.paragraph_format.line_spacing for p in document.paragraphs[:3]]
    return float(spacings == [1.0, 2.0, 1.5])


@metric()
def check_italic_font_size_14(result_path: str | None, expected_path: str | None) -> float:
    """1 when the documents have the same text and every italic run is 14 pt."""
    if not _same_text(result_path, expected_path):
        return 0.0
    document = result_docx(result_path)
    for paragraph in document.paragraphs:
        for run in paragraph.runs:
            if run.italic and (run.font.size is None or run.font.size.pt != 14):
                return 0.0
    return 1.0


@metric(arity=1)
def evaluate_alignment(result_path: str | None) -> float:
    """1 when in every sentence of three or more words, its first three words and the rest
    each appear as single-space-separated text, in that order."""
    document = result_docx(result_path)
    if document is None:
        return 0.0
    for paragraph in document.paragraphs:
        for sentence in paragraph.text.split("."):
            words = sentence.strip().split()
            if len(words) < 3:
                continue
            head, tail = " ".join(words[:3]), " ".join(words[3:])
            if not (head in sentence and tail in sentence and sentence.find(head) < sentence.find(tail)):
                return 0.0
    return 1.0


def _train_lines(document) -> list[list[str]]:
    return [p.text.split(",") for p in document.paragraphs if len(p.text.split(",")) == 4]


@metric()
def check_no_duplicates(initial_path: str | None, processed_path: str | None) -> float:
    """1 when the processed document's records (lines "time, train id, station, platform")
    have unique train ids, the same ids as the initial document and one record per id."""
    initial = result_docx(initial_path)
    processed = result_docx(processed_path)
    if initial is None or processed is None:
        return 0.0
    initial_ids = {parts[1].strip() for parts in _train_lines(initial)}
    seen: set[str] = set()
    for parts in _train_lines(processed):
        train = parts[1].strip()
        if train in seen:
            return 0.0
        seen.add(train)
    return float(seen == initial_ids and len(_train_lines(processed)) == len(initial_ids))


@metric()
def compare_unique_train_records(processed_path: str | None, expected_paths: list) -> float:
    """expected_paths [gold, initial]: 1 when every processed line comes from the initial
    document, train ids are unique, the id set equals the gold one, and the processed and
    gold documents have as many lines."""
    if not isinstance(expected_paths, list) or len(expected_paths) < 2:
        raise JudgeError(f"compare_unique_train_records needs [gold, initial] documents, got {expected_paths!r}")

    def lines(doc) -> list[str]:
        return [p.text.strip() for p in doc.paragraphs if p.text.strip()]

    def ids(found: list[str]) -> list[str]:
        return [line.split(",")[1].strip() for line in found if len(line.split(",")) == 4]

    gold = lines(load_expected(_document, expected_paths[0], "gold document"))
    initial = lines(load_expected(_document, expected_paths[1], "initial document"))
    document = result_docx(processed_path)
    if document is None:
        return 0.0
    processed = lines(document)
    processed_ids = ids(processed)
    return float(
        set(processed) <= set(initial)
        and len(processed_ids) == len(set(processed_ids))
        and set(processed_ids) == set(ids(gold))
        and len(processed) == len(gold)
    )


def docx_highlighted_texts(path: str) -> set[str]:
    """The texts of runs with a highlight other than 'none' in a .docx."""
    from lxml import etree

    with zipfile.ZipFile(path) as archive:
        root = etree.fromstring(archive.read("word/document.xml"))
    found = set()
    for run in root.iter(f"{{{W}}}r"):
        highlight = run.find(f".//{{{W}}}highlight")
        text = run.find(f".//{{{W}}}t")
        if highlight is not None and highlight.get(f"{{{W}}}val") != "none" and text is not None:
            found.add(text.text)
    return found


@metric()
def compare_highlighted_text(result_path: str | None, expected_path: str | None) -> float:
    """1 when both documents highlight the same set of run texts."""
    expected = load_expected(docx_highlighted_texts, expected_path, "expected document")
    result = load_result(docx_highlighted_texts, result_path, "zip")
    return float(result is not None and result == expected)


@metric()
def compare_references(
    result_path: str | None,
    expected_path: str | None,
    reference_indicator: str = "References",
    reference_base_result: float = 0.5,
    **_,
) -> float:
    """Compare the reference lists after the paragraph `reference_indicator`: 1 when neither
    document has one, 0 when one does; else the mean similarity ratio r of the reference
    paragraphs, rescaled as (r - base) / (1 - base), and 0 below base + 0.01."""
    expected = [p.text for p in expected_docx(expected_path).paragraphs]
    document = result_docx(result_path)
    if document is None:
        return 0.0
    result = [p.text for p in document.paragraphs]
    if reference_indicator not in result and reference_indicator not in expected:
        return 1.0
    if reference_indicator not in result or reference_indicator not in expected:
        return 0.0
    first = [p for p in result[result.index(reference_indicator) + 1 :] if p.strip()]
    second = [p for p in expected[expected.index(reference_indicator) + 1 :] if p.strip()]
    if len(first) != len(second):
        return 0.0
    if not first:
        return 1.0
    similarity = sum(fuzzy_ratio(a, b) for a, b in zip(first, second)) / len(first)
    if similarity >= reference_base_result + 0.01:
        return clamp01((similarity - reference_base_result) / (1 - reference_base_result))
    return 0.0


@metric()
def fuzzy_place_math(result_path: str | None, rules: dict) -> float:
    """With exactly three words in the document: the mean, over them, of the best similarity
    ratio to any of rules['expected']; else 0."""
    accepted = rule(rules, "expected")
    if not isinstance(accepted, list):
        raise JudgeError(f"fuzzy_place_math needs a list rules['expected'], got {accepted!r}")
    document = result_docx(result_path)
    if document is None:
        return 0.0
    words = [w for p in document.paragraphs for w in p.text.split()]
    if len(words) != 3:
        return 0.0
    return sum(max((fuzzy_ratio(w, a) for a in accepted), default=0.0) for w in words) / 3


@metric()
def contains_page_break(result_path: str | None, rules: dict) -> float:
    """1 when the document has a page break (exactly rules['page_break_count'] of them when
    given)."""
    wanted = rules.get("page_break_count") if isinstance(rules, dict) else None
    document = result_docx(result_path)
    if document is None:
        return 0.0
    count = sum(
        1
        for p in document.paragraphs
        for run in p.runs
        for br in run.element.iter(f"{{{W}}}br")
        if br.get(f"{{{W}}}type") == "page"
    )
    if wanted is not None and count != wanted:
        return 0.0
    return float(count > 0)


_REGISTRY = "http://openoffice.org/2001/registry"


def registry_value(path: str, item_path: str, prop: str) -> str | None:
    """A value from a LibreOffice registry file (registrymodifications.xcu): the last
    <value> of prop `prop` under an item with oor:path `item_path`."""
    from lxml import etree

    found = None
    for item in etree.parse(path).getroot().iter("item"):
        if item.get(f"{{{_REGISTRY}}}path") != item_path:
            continue
        for node in item.iter("prop"):
            if node.get(f"{{{_REGISTRY}}}name") == prop:
                for value in node.iter("value"):
                    found = value.text
    return found


@metric()
def find_default_font(config_path: str | None, rules: dict) -> float:
    """1 when LibreOffice Writer's default font (registry DefaultFont/Standard) is
    rules['font_name']."""
    wanted = rule(rules, "font_name")
    font = load_result(
        lambda p: registry_value(p, "/org.openoffice.Office.Writer/DefaultFont", "Standard"), config_path, "xml"
    )
    return float(font is not None and font == wanted)


def epub_parts(path: str) -> list[tuple[str, list[str]]]:
    """The comparable parts of an EPUB, sorted by name, as lines: toc.ncx without navPoint
    lines, content.opf without dc:identifier lines, and every .html part re-indented."""
    import lxml.html

    parts = []
    with zipfile.ZipFile(path) as archive:
        names = archive.namelist()
        for name, dropped in (("toc.ncx", "navPoint"), ("content.opf", "dc:identifier")):
            if name in names:
                lines = archive.read(name).decode("utf-8", errors="replace").splitlines()
                parts.append((name, [line for line in lines if dropped not in line]))
        for name in names:
            if name.endswith(".html"):
                raw = archive.read(name).decode("utf-8", errors="replace").replace("\n", "").replace("\r", "")
                html = lxml.html.tostring(lxml.html.fromstring(raw.encode()), pretty_print=True, encoding="unicode")
                parts.append((name, html.splitlines()))
    return sorted(parts)


@metric()
def compare_epub(result_path: str | None, expected_path: str | None) -> float:
    """The mean line-level similarity of the two EPUBs' parts, paired in name order."""
    expected = load_expected(epub_parts, expected_path, "expected EPUB")
    result = load_result(epub_parts, result_path, "zip")
    if not result:
        return 0.0
    return sum(sequence_ratio(a[1], b[1]) for a, b in zip(result, expected)) / len(result)
