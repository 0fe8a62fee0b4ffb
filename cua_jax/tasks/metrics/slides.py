"""Presentation metrics (OSWorld's slides.py) on python-pptx, plus the LibreOffice Impress
settings OSWorld checks in its registry file."""

from __future__ import annotations

import zipfile
from typing import Any
from xml.etree import ElementTree

from cua_jax.tasks.metrics.base import (
    JudgeError,
    approximately_equal,
    clamp01,
    load_expected,
    load_result,
    metric,
    result_file,
    rule,
)
from cua_jax.tasks.metrics.documents import registry_value
from cua_jax.tasks.metrics.measures import normalised_rgb_distance

_A = "http://schemas.openxmlformats.org/drawingml/2006/main"
_P = "http://schemas.openxmlformats.org/presentationml/2006/main"
_NS = {"a": _A, "p": _P}
_PICTURE, _TABLE, _FREEFORM = 13, 19, 5  # MSO_SHAPE_TYPE values


def _presentation(path: str):
    from pptx import Presentation

    return Presentation(path)


def result_pptx(path: Any):
    return load_result(_presentation, path, "pptx")


def expected_pptx(path: Any):
    return load_expected(_presentation, path, "expected presentation")


def _background_rgb(slide) -> Any:
    """A slide's solid background colour (its master's when it follows the master)."""
    fill = slide.background.fill
    try:
        if fill.type == 1:
            return fill.fore_color.rgb
        if fill.type == 5:
            master = slide.slide_layout.slide_master.background.fill
            return master.fore_color.rgb if master.type == 1 else None
    except (AttributeError, TypeError, ValueError):
        return None
    return None


def _notes(slide) -> str:
    frame = slide.notes_slide.notes_text_frame if slide.has_notes_slide else None
    return frame.text.strip() if frame is not None else ""


def _text_shapes(shapes) -> list:
    found = []
    for shape in shapes:
        if hasattr(shape, "text") and hasattr(shape, "text_frame"):
            found.append(shape)
        if hasattr(shape, "shapes"):
            found.extend(_text_shapes(shape.shapes))
    return found


def _nonempty_runs(paragraph) -> list:
    return [r for r in paragraph.runs if (r.text or "").strip()]


def _paired_runs(para1, para2) -> tuple[list, list]:
    """The runs to compare: all of them, or only the non-empty ones when both paragraphs
    are blank (0 runs and 1 empty run are the same paragraph)."""
    if not (para1.text or "").strip() and not (para2.text or "").strip():
        return _nonempty_runs(para1), _nonempty_runs(para2)
    return para1.runs, para2.runs


def _flag_differs(first: Any, second: Any) -> bool:
    """Bold / italic differ, None and False both meaning off."""
    return first != second and not (first in (None, False) and second in (None, False))


def _underline_differs(first: Any, second: Any) -> bool:
    return first != second and ((first is not None and second is not None) or True in (first, second))


def bullets(part_xml: bytes) -> list[tuple]:
    """(level, bullet character, text, bullet colour) of every non-empty paragraph of a
    slide part."""
    root = ElementTree.fromstring(part_xml)
    found = []
    for paragraph in root.iter(f"{{{_A}}}p"):
        props = paragraph.find("a:pPr", _NS)
        if props is not None:
            level = props.get("lvl")
            char_node = props.find("a:buChar", _NS)
            colour_node = props.find("a:buClr/a:srgbClr", _NS)
            char = char_node.get("char") if char_node is not None else "No Bullet"
            colour = colour_node.get("val") if colour_node is not None else "No Color"
        else:
            level, char, colour = "No Level", "No Bullet", "No Color"
        text = "".join(t.text or "" for t in paragraph.iter(f"{{{_A}}}t"))
        if text.strip():
            found.append((level, char, text, colour))
    return found


def bullets_match(first: list[tuple], second: list[tuple]) -> bool:
    """Same texts and bullet characters; levels compared only where a bullet shows (a
    missing level is 0); colours ignored."""
    if len(first) != len(second):
        return False
    for (lvl1, char1, text1, _), (lvl2, char2, text2, _) in zip(first, second):
        if text1 != text2 or char1 != char2:
            return False
        if (char1 != "No Bullet" or char2 != "No Bullet") and (lvl1 or "0") != (lvl2 or "0"):
            return False
    return True


_PPTX_OPTIONS = {
    "examine_number_of_slides": True,
    "examine_shape": True,
    "examine_text": True,
    "examine_indent": True,
    "examine_font_name": True,
    "examine_font_size": True,
    "examine_font_bold": True,
    "examine_font_italic": True,
    "examine_color_rgb": True,
    "examine_font_underline": True,
    "examine_strike_through": True,
    "examine_alignment": True,
    "examine_title_bottom_position": False,
    "examine_table_bottom_position": False,
    "examine_run_count": True,
    "examine_right_position": False,
    "examine_top_position": False,
    "examine_shape_for_shift_size": False,
    "examine_image_size": False,
    "examine_modify_height": False,
    "examine_bullets": True,
    "examine_background_color": True,
    "examine_note": True,
}
# Options OSWorld's tasks pass that its comparison does not read.
_PPTX_IGNORED_OPTIONS = ("enable_debug", "examine_shape_lenient_height")


@metric()
def compare_pptx_files(
    result_path: str | None, expected_path: str | None, approximately_tolerance: float = 0.005, **options
) -> float:
    """1 when two presentations match slide by slide, shape by shape (OSWorld's checks).

    Options (booleans, defaults as OSWorld's): examine_number_of_slides, examine_shape
    (positions and sizes within `approximately_tolerance` relative difference, blank
    shapes exempt), examine_text, examine_indent, examine_font_name, examine_font_size,
    examine_font_bold, examine_font_italic, examine_color_rgb, examine_font_underline,
    examine_strike_through, examine_alignment, examine_run_count, examine_bullets,
    examine_background_color, examine_note (all on), and OSWorld's task-specific
    examine_title_bottom_position, examine_table_bottom_position, examine_right_position,
    examine_top_position, examine_shape_for_shift_size, examine_image_size,
    examine_modify_height (off). enable_debug and examine_shape_lenient_height are accepted
    and change nothing (OSWorld's comparison does not read them); options whose names
    start with "_" are notes.
    """
    unknown = sorted(
        k for k in options if k not in _PPTX_OPTIONS and k not in _PPTX_IGNORED_OPTIONS and not k.startswith("_")
    )
    if unknown:
        raise JudgeError(f"compare_pptx_files has no option {unknown[0]!r}; known: {sorted(_PPTX_OPTIONS)}")
    o = {k: bool(options.get(k, default)) for k, default in _PPTX_OPTIONS.items()}
    expected = expected_pptx(expected_path)
    prs = result_pptx(result_path)
    if prs is None:
        return 0.0

    def close(a, b) -> bool:
        return approximately_equal(a or 0, b or 0, approximately_tolerance)

    def same_box(s1, s2) -> bool:
        return (
            close(s1.left, s2.left)
            and close(s1.top, s2.top)
            and close(s1.width, s2.width)
            and close(s1.height, s2.height)
        )

    if len(prs.slides) != len(expected.slides) and o["examine_number_of_slides"]:
        return 0.0
    for slide_number, (slide1, slide2) in enumerate(zip(prs.slides, expected.slides), start=1):
        if o["examine_background_color"] and _background_rgb(slide1) != _background_rgb(slide2):
            return 0.0
        if o["examine_note"] and _notes(slide1) != _notes(slide2):
            return 0.0
        if len(slide1.shapes) != len(slide2.shapes):
            return 0.0
        for shape1, shape2 in zip(slide1.shapes, slide2.shapes):
            has_text = hasattr(shape1, "text") and hasattr(shape2, "text")
            if o["examine_title_bottom_position"]:
                if has_text and shape1.text == shape2.text:
                    if shape1.text == "Product Comparison" and (shape1.top <= shape2.top or shape1.top < 3600000):
                        return 0.0
                elif not same_box(shape1, shape2):
                    return 0.0
            if o["examine_table_bottom_position"]:
                if slide_number == 3 and shape1.shape_type == _TABLE and shape2.shape_type == _TABLE:
                    if shape1.top <= shape2.top or shape1.top < 3600000:
                        return 0.0
                elif not same_box(shape1, shape2):
                    return 0.0
            if (
                o["examine_right_position"]
                and slide_number == 2
                and not hasattr(shape1, "text")
                and not hasattr(shape2, "text")
                and (shape1.left <= shape2.left or shape1.left < 4320000)
            ):
                return 0.0
            if (
                o["examine_top_position"]
                and slide_number == 2
                and shape1.shape_type == _PICTURE
                and shape2.shape_type == _PICTURE
                and (shape1.top >= shape2.top or shape1.top > 1980000)
            ):
                return 0.0
            if (
                o["examine_shape_for_shift_size"]
                and not same_box(shape1, shape2)
                and not (has_text and shape1.text == shape2.text == "Elaborate on what you want to discuss.")
            ):
                return 0.0
            both_blank = (
                not (getattr(shape1, "text", "") or "").strip() and not (getattr(shape2, "text", "") or "").strip()
            )
            if o["examine_shape"] and not both_blank and not same_box(shape1, shape2):
                return 0.0
            if o["examine_image_size"]:
                if shape1.shape_type == _PICTURE and shape2.shape_type == _PICTURE:
                    if not (close(shape1.width, shape2.width) and close(shape1.height, shape2.height)):
                        return 0.0
                elif not same_box(shape1, shape2):
                    return 0.0
            if o["examine_modify_height"]:
                if (not hasattr(shape1, "text") and not hasattr(shape2, "text")) or (
                    shape1.shape_type == _FREEFORM and shape2.shape_type == _FREEFORM
                ):
                    if not close(shape1.height, shape2.height):
                        return 0.0
                elif not same_box(shape1, shape2):
                    return 0.0
            if (shape1.shape_type == _TABLE) != (shape2.shape_type == _TABLE):
                return 0.0
            if shape1.shape_type == _TABLE and not _tables_match(shape1.table, shape2.table, o):
                return 0.0
            if has_text and not _text_frames_match(shape1, shape2, o):
                return 0.0
        shapes1, shapes2 = _text_shapes(slide1.shapes), _text_shapes(slide2.shapes)
        if len(shapes1) != len(shapes2):
            return 0.0
        if o["examine_alignment"]:
            for t1, t2 in zip(shapes1, shapes2):
                if o["examine_text"] and t1.text.strip() != t2.text.strip():
                    return 0.0
                if len(t1.text_frame.paragraphs) != len(t2.text_frame.paragraphs):
                    return 0.0
                if any(
                    _alignment(p1) != _alignment(p2)
                    for p1, p2 in zip(t1.text_frame.paragraphs, t2.text_frame.paragraphs)
                ):
                    return 0.0
    return 1.0


def _alignment(paragraph) -> Any:
    from pptx.enum.text import PP_ALIGN

    return paragraph.alignment if paragraph.alignment is not None else PP_ALIGN.LEFT


def _colour(run) -> Any:
    try:
        return run.font.color.rgb
    except AttributeError:  # a colour that is not RGB (theme colour, none)
        return None


def _colours_differ(run1, run2) -> bool:
    """RGB colours differ; runs without an RGB colour (none, theme) are not compared."""
    c1, c2 = _colour(run1), _colour(run2)
    return c1 is not None and c2 is not None and c1 != c2


def _tables_match(table1, table2, o: dict) -> bool:
    if len(table1.rows) != len(table2.rows) or len(table1.columns) != len(table2.columns):
        return False
    for i in range(len(table1.rows)):
        for j in range(len(table1.columns)):
            cell1, cell2 = table1.cell(i, j), table2.cell(i, j)
            paragraphs1, paragraphs2 = cell1.text_frame.paragraphs, cell2.text_frame.paragraphs
            if len(paragraphs1) != len(paragraphs2):
                return False
            for para1, para2 in zip(paragraphs1, paragraphs2):
                runs1, runs2 = _paired_runs(para1, para2)
                if len(runs1) != len(runs2) and o["examine_run_count"]:
                    return False
                for run1, run2 in zip(runs1, runs2):
                    if o["examine_color_rgb"] and _colours_differ(run1, run2):
                        return False
                    if _flag_differs(run1.font.bold, run2.font.bold) or _flag_differs(
                        run1.font.italic, run2.font.italic
                    ):
                        return False
                    if _underline_differs(run1.font.underline, run2.font.underline):
                        return False
    return True


def _text_frames_match(shape1, shape2, o: dict) -> bool:
    if o["examine_text"] and shape1.text.strip() != shape2.text.strip():
        return False
    paragraphs1, paragraphs2 = shape1.text_frame.paragraphs, shape2.text_frame.paragraphs
    if len(paragraphs1) != len(paragraphs2):
        return False
    for para1, para2 in zip(paragraphs1, paragraphs2):
        if o["examine_alignment"] and _alignment(para1) != _alignment(para2):
            return False
        if o["examine_text"] and para1.text != para2.text:
            return False
        if o["examine_indent"] and para1.level != para2.level:
            # 0 and 1 (or none) render as the same continuation indent.
            if not ((para1.level or 0) in (0, 1) and (para2.level or 0) in (0, 1)):
                return False
        runs1, runs2 = _paired_runs(para1, para2)
        if len(runs1) != len(runs2) and o["examine_run_count"]:
            return False
        for run1, run2 in zip(runs1, runs2):
            f1, f2 = run1.font, run2.font
            if o["examine_font_name"] and f1.name != f2.name:
                return False
            if o["examine_font_size"] and f1.size != f2.size:
                return False
            if o["examine_font_bold"] and _flag_differs(f1.bold, f2.bold):
                return False
            if o["examine_font_italic"] and _flag_differs(f1.italic, f2.italic):
                return False
            if o["examine_color_rgb"] and _colours_differ(run1, run2):
                return False
            if o["examine_font_underline"] and _underline_differs(f1.underline, f2.underline):
                return False
            if o["examine_strike_through"] and (
                f1._element.attrib.get("strike", "noStrike") != f2._element.attrib.get("strike", "noStrike")
            ):
                return False
            if o["examine_bullets"]:
                try:
                    if not bullets_match(bullets(run1.part.blob), bullets(run2.part.blob)):
                        return False
                except ElementTree.ParseError:
                    pass
    return True


@metric()
def check_strikethrough(result_path: str | None, rules: dict) -> float:
    """1 when the first run of every listed paragraph (rules paragraph_index_s) of every
    listed shape (shape_index_s) of every listed slide (slide_index_s) is struck through."""
    slides, shapes, paragraphs = (rule(rules, k) for k in ("slide_index_s", "shape_index_s", "paragraph_index_s"))
    prs = result_pptx(result_path)
    if prs is None:
        return 0.0
    try:
        for s in slides:
            slide = prs.slides[s]
            for h in shapes:
                frame = slide.shapes[h].text_frame.paragraphs
                for p in paragraphs:
                    if "strike" not in frame[p].runs[0].font._element.attrib:
                        return 0.0
    except (IndexError, AttributeError):
        return 0.0
    return 1.0


@metric(arity=1)
def check_slide_orientation_Portrait(result_path: str | None) -> float:
    """1 when the slides are taller than wide."""
    prs = result_pptx(result_path)
    return float(prs is not None and prs.slide_width < prs.slide_height)


def _background_distance(slide, target, original) -> float:
    colour = _background_rgb(slide)
    if colour is None:
        return 1.0
    colour = tuple(colour)
    if original is not None and colour == tuple(original):
        return 1.0
    return normalised_rgb_distance(colour, target)


@metric()
def evaluate_presentation_fill_to_rgb_distance(result_path: str | None, rules: dict) -> float:
    """1 minus the mean (over slides) normalised RGB distance of each slide's solid
    background to rules['rgb']; a slide without a solid background, or still at
    rules['original_rgb'], counts as distance 1."""
    target = rule(rules, "rgb")
    original = rules.get("original_rgb")
    prs = result_pptx(result_path)
    if prs is None or not len(prs.slides):
        return 0.0
    return clamp01(1 - sum(_background_distance(s, target, original) for s in prs.slides) / len(prs.slides))


@metric()
def check_transition(result_path: str | None, rules: dict) -> float:
    """1 when slide rules['slide_idx'] (0-based) has a transition of type
    rules['transition_type'] (e.g. "dissolve")."""
    index, kind = rule(rules, "slide_idx"), rule(rules, "transition_type")
    local = result_file(result_path)
    if local is None:
        return 0.0
    try:
        with zipfile.ZipFile(local) as archive:
            root = ElementTree.fromstring(archive.read(f"ppt/slides/slide{index + 1}.xml"))
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError):
        return 0.0
    transition = root.find(".//p:transition", _NS)
    return float(transition is not None and transition.find(f".//p:{kind}", _NS) is not None)


def _hex_rgb(text: str | None) -> tuple[int, int, int] | None:
    text = (text or "").lstrip("#")
    if len(text) != 6:
        return None
    try:
        return int(text[0:2], 16), int(text[2:4], 16), int(text[4:6], 16)
    except ValueError:
        return None


def colour_is(name: str, rgb: tuple[int, int, int], threshold: int = 50) -> bool:
    """Whether an RGB colour reads as red, blue, green (that channel exceeds both others by
    more than `threshold`) or black (every channel below it)."""
    r, g, b = rgb
    tests = {
        "red": r > g + threshold and r > b + threshold,
        "blue": b > g + threshold and b > r + threshold,
        "green": g > r + threshold and g > b + threshold,
        "black": r < threshold and g < threshold and b < threshold,
    }
    if name not in tests:
        raise JudgeError(f"unknown colour {name!r}; known: {list(tests)}")
    return tests[name]


def master_number_colour(path: str) -> str | None:
    """The colour of the slide-number placeholder of the first slide master, falling back
    to the footer / date placeholders, then to what OSWorld's reading finds (its placeholder
    look-ups search the empty p:ph element itself): the last non-black run colour of the
    master, then its last colour of all."""
    with zipfile.ZipFile(path) as archive:
        root = ElementTree.fromstring(archive.read("ppt/slideMasters/slideMaster1.xml"))
    for shape in root.iter(f"{{{_P}}}sp"):
        placeholder = shape.find(".//p:nvPr/p:ph", _NS)
        if placeholder is not None and placeholder.get("type") == "sldNum":
            colour = shape.find(".//a:solidFill/a:srgbClr", _NS)
            if colour is not None:
                return colour.get("val")
    for shape in root.iter(f"{{{_P}}}sp"):
        placeholder = shape.find(".//p:nvPr/p:ph", _NS)
        if placeholder is not None and placeholder.get("type") in ("sldNum", "ftr", "dt"):
            colour = shape.find(".//a:solidFill/a:srgbClr", _NS)
            if colour is not None:
                return colour.get("val")
    for colour in reversed(root.findall(".//a:rPr//a:solidFill//a:srgbClr", _NS)):
        if colour.get("val") and colour.get("val") != "000000":
            return colour.get("val")
    colours = root.findall(".//a:solidFill//a:srgbClr", _NS)
    for colour in reversed(colours):
        if colour.get("val") and colour.get("val") != "000000":
            return colour.get("val")
    return colours[-1].get("val") if colours else None


@metric()
def check_page_number_colors(result_path: str | None, rules: dict) -> float:
    """1 when the slide master's slide-number colour reads as rules['color'] (red, blue,
    green or black)."""
    wanted = rule(rules, "color")
    colour = load_result(master_number_colour, result_path, "zip")
    rgb = _hex_rgb(colour)
    return float(rgb is not None and colour_is(wanted, rgb))


@metric(arity=1)
def check_slide_numbers_color(result_path: str | None) -> float:
    """1 when some slide shows a number and the master's "<number>" placeholder is red."""
    prs = result_pptx(result_path)
    if prs is None:
        return 0.0
    numbered = any(hasattr(shape, "text") and shape.text.isdigit() for slide in prs.slides for shape in slide.shapes)
    if not numbered:
        return 0.0
    for master in prs.slide_masters:
        for placeholder in master.placeholders:
            if placeholder.has_text_frame and placeholder.text == "<number>" and placeholder.text_frame.paragraphs:
                try:
                    rgb = placeholder.text_frame.paragraphs[0].font.color.rgb
                except AttributeError:
                    return 0.0
                return float(rgb is not None and tuple(rgb) == (255, 0, 0))
    return 0.0


@metric()
def check_image_stretch_and_center(result_path: str | None, original_path: str | None) -> float:
    """1 when the first picture of the original's first slide appears (same image bytes) on
    the result's first slide stretched to the slide size and centred, within half an inch."""
    from pptx.util import Inches

    original = expected_pptx(original_path)
    prs = result_pptx(result_path)
    if prs is None or not len(prs.slides) or not len(original.slides):
        return 0.0
    pictures = [s for s in original.slides[0].shapes if s.shape_type == _PICTURE]
    if not pictures:
        return 0.0
    blob = pictures[0].image.blob
    moved = None
    for shape in prs.slides[0].shapes:
        if shape.shape_type == _PICTURE and shape.image.blob == blob:
            moved = shape
    if moved is None:
        return 0.0
    width, height, slack = original.slide_width, original.slide_height, Inches(0.5)
    return float(
        abs(moved.width - width) <= slack
        and abs(moved.height - height) <= slack
        and abs(moved.left - (width - moved.width) / 2) <= slack
        and abs(moved.top - (height - moved.height) / 2) <= slack
    )


def _registry(path: Any, item_path: str, prop: str) -> str | None:
    return load_result(lambda p: registry_value(p, item_path, prop), path, "xml")


@metric(arity=1)
def check_presenter_console_disable(config_path: str | None) -> float:
    """1 when LibreOffice Impress's presenter screen is disabled in its registry file."""
    value = _registry(config_path, "/org.openoffice.Office.Impress/Misc/Start", "EnablePresenterScreen")
    return float(value is not None and value.lower() == "false")


@metric()
def check_auto_saving_time(config_path: str | None, rules: dict) -> float:
    """1 when LibreOffice's autosave interval (registry AutoSaveTimeIntervall) is
    rules['minutes']."""
    minutes = rule(rules, "minutes")
    value = _registry(config_path, "/org.openoffice.Office.Common/Save/Document", "AutoSaveTimeIntervall")
    try:
        return float(value is not None and int(value) == minutes)
    except ValueError:
        return 0.0


@metric(arity=1)
def check_left_panel(accessibility_tree: Any) -> float:
    """1 when the accessibility tree (XML) has a document-frame named "Slides View" (the
    slide panel is open)."""
    if not isinstance(accessibility_tree, str) or not accessibility_tree:
        return 0.0
    try:
        root = ElementTree.fromstring(accessibility_tree)
    except ElementTree.ParseError:
        return 0.0
    return float(any(frame.get("name") == "Slides View" for frame in root.iter("document-frame")))
