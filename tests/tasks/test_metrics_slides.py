"""Presentation metrics on .pptx files built with python-pptx."""

import io
import zipfile

import pytest
from lxml import etree
from PIL import Image
from pptx import Presentation
from pptx.dml.color import RGBColor
from pptx.enum.text import PP_ALIGN
from pptx.util import Inches, Pt

from cua_jax.tasks.metrics import JudgeError
from cua_jax.tasks.metrics import slides as Sl


def deck(path, build=None, slides=1):
    prs = Presentation()
    for _ in range(slides):
        prs.slides.add_slide(prs.slide_layouts[6])
    if build:
        build(prs)
    prs.save(path)
    return str(path)


def text_box(text="Hello", left=1, bold=None, size=None, colour=None, align=None, notes=None, strike=False):
    def build(prs):
        slide = prs.slides[0]
        box = slide.shapes.add_textbox(Inches(left), Inches(1), Inches(4), Inches(1))
        paragraph = box.text_frame.paragraphs[0]
        run = paragraph.add_run()
        run.text = text
        if bold is not None:
            run.font.bold = bold
        if size is not None:
            run.font.size = Pt(size)
        if colour is not None:
            run.font.color.rgb = RGBColor(*colour)
        if align is not None:
            paragraph.alignment = align
        if strike:
            run.font._element.set("strike", "sngStrike")
        if notes is not None:
            slide.notes_slide.notes_text_frame.text = notes

    return build


def test_compare_pptx_files_and_its_options(tmp_path):
    expected = deck(tmp_path / "e.pptx", text_box())
    assert Sl.compare_pptx_files(deck(tmp_path / "r.pptx", text_box()), expected) == 1.0
    cases = {
        "text": text_box("Bye"),
        "bold": text_box(bold=True),
        "size": text_box(size=30),
        "align": text_box(align=PP_ALIGN.CENTER),
        "moved": text_box(left=3),
        "notes": text_box(notes="remember"),
        "strike": text_box(strike=True),
    }
    option = {
        "text": "examine_text",
        "bold": "examine_font_bold",
        "size": "examine_font_size",
        "align": "examine_alignment",
        "moved": "examine_shape",
        "notes": "examine_note",
        "strike": "examine_strike_through",
    }
    for name, build in cases.items():
        path = deck(tmp_path / f"{name}.pptx", build)
        assert Sl.compare_pptx_files(path, expected) == 0.0, name
        if name != "text":  # a different text also differs paragraph by paragraph
            assert Sl.compare_pptx_files(path, expected, **{option[name]: False}) == 1.0, name
    assert (
        Sl.compare_pptx_files(deck(tmp_path / "bold_false.pptx", text_box(bold=False)), expected) == 1.0
    )  # None == False
    # colours compare only where both runs have an RGB colour (OSWorld's reading)
    assert Sl.compare_pptx_files(deck(tmp_path / "red.pptx", text_box(colour=(255, 0, 0))), expected) == 1.0
    black = deck(tmp_path / "black.pptx", text_box(colour=(0, 0, 0)))
    assert Sl.compare_pptx_files(deck(tmp_path / "red2.pptx", text_box(colour=(255, 0, 0))), black) == 0.0
    assert (
        Sl.compare_pptx_files(
            deck(tmp_path / "red3.pptx", text_box(colour=(255, 0, 0))), black, examine_color_rgb=False
        )
        == 1.0
    )
    more = deck(tmp_path / "more.pptx", text_box(), slides=2)
    assert Sl.compare_pptx_files(more, expected) == 0.0
    assert Sl.compare_pptx_files(str(tmp_path / "absent.pptx"), expected) == 0.0
    assert Sl.compare_pptx_files(deck(tmp_path / "r2.pptx", text_box()), expected, _note="x", enable_debug=False) == 1.0
    with pytest.raises(JudgeError, match="no option 'examine_everything'"):
        Sl.compare_pptx_files(expected, expected, examine_everything=True)


def test_compare_pptx_tolerance_and_background(tmp_path):
    expected = deck(tmp_path / "e.pptx", text_box(left=2))
    nudged = deck(tmp_path / "n.pptx", text_box(left=2.005))
    assert Sl.compare_pptx_files(nudged, expected) == 1.0
    assert Sl.compare_pptx_files(nudged, expected, approximately_tolerance=0.0001) == 0.0

    def background(prs):
        fill = prs.slides[0].background.fill
        fill.solid()
        fill.fore_color.rgb = RGBColor(0, 128, 0)

    green = deck(tmp_path / "g.pptx", background)
    assert Sl.compare_pptx_files(green, deck(tmp_path / "p.pptx")) == 0.0
    assert Sl.compare_pptx_files(green, deck(tmp_path / "p2.pptx"), examine_background_color=False) == 1.0


def table_deck(value):
    def build(prs):
        table = prs.slides[0].shapes.add_table(2, 2, Inches(1), Inches(1), Inches(4), Inches(2)).table
        table.cell(0, 0).text = "a"
        table.cell(1, 1).text = value
        table.cell(1, 1).text_frame.paragraphs[0].runs[0].font.bold = value == "bold"

    return build


def test_compare_pptx_tables(tmp_path):
    expected = deck(tmp_path / "e.pptx", table_deck("x"))
    assert Sl.compare_pptx_files(deck(tmp_path / "r.pptx", table_deck("x")), expected) == 1.0
    assert Sl.compare_pptx_files(deck(tmp_path / "w.pptx", table_deck("bold")), expected) == 0.0


def test_bullets_helpers():
    xml = (
        b'<p:sld xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main" '
        b'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"><a:p><a:pPr lvl="1"><a:buChar char="*"/>'
        b"</a:pPr><a:r><a:t>item</a:t></a:r></a:p><a:p><a:r><a:t>plain</a:t></a:r></a:p></p:sld>"
    )
    found = Sl.bullets(xml)
    assert found == [("1", "*", "item", "No Color"), ("No Level", "No Bullet", "plain", "No Color")]
    assert Sl.bullets_match(found, found)
    assert not Sl.bullets_match(found, [("2", "*", "item", "No Color"), found[1]])


def test_check_strikethrough_and_orientation(tmp_path):
    rules = {"slide_index_s": [0], "shape_index_s": [0], "paragraph_index_s": [0]}
    assert Sl.check_strikethrough(deck(tmp_path / "s.pptx", text_box(strike=True)), rules) == 1.0
    assert Sl.check_strikethrough(deck(tmp_path / "p.pptx", text_box()), rules) == 0.0
    assert Sl.check_strikethrough(deck(tmp_path / "e.pptx"), rules) == 0.0  # no such shape

    def portrait(prs):
        prs.slide_width, prs.slide_height = Inches(7.5), Inches(10)

    assert Sl.check_slide_orientation_Portrait(deck(tmp_path / "tall.pptx", portrait)) == 1.0
    assert Sl.check_slide_orientation_Portrait(deck(tmp_path / "wide.pptx")) == 0.0


def solid_background(rgb):
    def build(prs):
        fill = prs.slides[0].background.fill
        fill.solid()
        fill.fore_color.rgb = RGBColor(*rgb)

    return build


def test_evaluate_presentation_fill_to_rgb_distance(tmp_path):
    rules = {"rgb": [0, 0, 255], "original_rgb": [255, 255, 255]}
    assert (
        Sl.evaluate_presentation_fill_to_rgb_distance(deck(tmp_path / "b.pptx", solid_background((0, 0, 255))), rules)
        == 1.0
    )
    assert (
        Sl.evaluate_presentation_fill_to_rgb_distance(
            deck(tmp_path / "w.pptx", solid_background((255, 255, 255))), rules
        )
        == 0.0
    )
    partial = Sl.evaluate_presentation_fill_to_rgb_distance(
        deck(tmp_path / "n.pptx", solid_background((0, 0, 200))), rules
    )
    assert partial == pytest.approx(1 - 55 / (3 * 255**2) ** 0.5)


def with_transition(source, target, kind):
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for item in original.infolist():
            data = original.read(item.filename)
            if item.filename == "ppt/slides/slide1.xml":
                data = data.replace(b"</p:sld>", f"<p:transition><p:{kind}/></p:transition></p:sld>".encode())
            copy.writestr(item, data)
    return str(target)


def test_check_transition(tmp_path):
    plain = deck(tmp_path / "p.pptx")
    rules = {"slide_idx": 0, "transition_type": "dissolve"}
    assert Sl.check_transition(with_transition(plain, tmp_path / "d.pptx", "dissolve"), rules) == 1.0
    assert Sl.check_transition(with_transition(plain, tmp_path / "f.pptx", "fade"), rules) == 0.0
    assert Sl.check_transition(plain, {"slide_idx": 3, "transition_type": "dissolve"}) == 0.0


def with_master_number_colour(source, target, colour):
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for item in original.infolist():
            data = original.read(item.filename)
            if item.filename == "ppt/slideMasters/slideMaster1.xml":
                root = etree.fromstring(data)
                ns = {
                    "p": "http://schemas.openxmlformats.org/presentationml/2006/main",
                    "a": "http://schemas.openxmlformats.org/drawingml/2006/main",
                }
                for shape in root.iterfind(".//p:sp", ns):
                    placeholder = shape.find(".//p:nvPr/p:ph", ns)
                    if placeholder is not None and placeholder.get("type") == "sldNum":
                        shape.find(".//a:p", ns).insert(
                            0,
                            etree.fromstring(
                                f'<a:r xmlns:a="{ns["a"]}"><a:rPr lang="en-US"><a:solidFill><a:srgbClr val="{colour}"/>'
                                "</a:solidFill></a:rPr><a:t>n</a:t></a:r>"
                            ),
                        )
                data = etree.tostring(root)
            copy.writestr(item, data)
    return str(target)


def test_check_page_number_colors(tmp_path):
    plain = deck(tmp_path / "p.pptx")
    red = with_master_number_colour(plain, tmp_path / "red.pptx", "E01010")
    assert Sl.master_number_colour(red) == "E01010"
    assert Sl.check_page_number_colors(red, {"color": "red"}) == 1.0
    assert Sl.check_page_number_colors(red, {"color": "blue"}) == 0.0
    assert (
        Sl.check_page_number_colors(with_master_number_colour(plain, tmp_path / "b.pptx", "1010E0"), {"color": "blue"})
        == 1.0
    )
    with pytest.raises(JudgeError, match="unknown colour"):
        Sl.colour_is("purple", (1, 2, 3))
    assert Sl.colour_is("black", (10, 10, 10)) and Sl.colour_is("green", (0, 200, 0))


def test_check_slide_numbers_color(tmp_path):
    # the number placeholder must be a master placeholder: reuse the layout's slide-number one
    def numbered_placeholder(colour):
        def build(prs):
            prs.slides[0].shapes.add_textbox(0, 0, Inches(1), Inches(1)).text_frame.text = "1"
            for placeholder in prs.slide_masters[0].placeholders:
                if placeholder.placeholder_format.type is not None and "SLIDE_NUMBER" in str(
                    placeholder.placeholder_format.type
                ):
                    placeholder.text_frame.text = "<number>"
                    placeholder.text_frame.paragraphs[0].font.color.rgb = RGBColor(*colour)

        return build

    assert Sl.check_slide_numbers_color(deck(tmp_path / "r.pptx", numbered_placeholder((255, 0, 0)))) == 1.0
    assert Sl.check_slide_numbers_color(deck(tmp_path / "b.pptx", numbered_placeholder((0, 0, 255)))) == 0.0
    assert Sl.check_slide_numbers_color(deck(tmp_path / "n.pptx")) == 0.0


def test_check_image_stretch_and_center(tmp_path):
    buffer = io.BytesIO()
    Image.new("RGB", (16, 9), "red").save(buffer, format="PNG")

    def picture(full):
        def build(prs):
            buffer.seek(0)
            if full:
                prs.slides[0].shapes.add_picture(buffer, 0, 0, prs.slide_width, prs.slide_height)
            else:
                prs.slides[0].shapes.add_picture(buffer, Inches(1), Inches(1), Inches(2), Inches(1))

        return build

    original = deck(tmp_path / "o.pptx", picture(False))
    assert Sl.check_image_stretch_and_center(deck(tmp_path / "r.pptx", picture(True)), original) == 1.0
    assert Sl.check_image_stretch_and_center(deck(tmp_path / "w.pptx", picture(False)), original) == 0.0


def registry(path, item, prop, value):
    path.write_text(
        '<?xml version="1.0"?><oor:items xmlns:oor="http://openoffice.org/2001/registry">'
        f'<item oor:path="{item}"><prop oor:name="{prop}" oor:op="fuse"><value>{value}</value></prop></item>'
        "</oor:items>"
    )
    return str(path)


def test_impress_settings_and_left_panel(tmp_path):
    start = "/org.openoffice.Office.Impress/Misc/Start"
    assert (
        Sl.check_presenter_console_disable(registry(tmp_path / "a.xcu", start, "EnablePresenterScreen", "false")) == 1.0
    )
    assert (
        Sl.check_presenter_console_disable(registry(tmp_path / "b.xcu", start, "EnablePresenterScreen", "true")) == 0.0
    )
    save = "/org.openoffice.Office.Common/Save/Document"
    assert (
        Sl.check_auto_saving_time(registry(tmp_path / "c.xcu", save, "AutoSaveTimeIntervall", "3"), {"minutes": 3})
        == 1.0
    )
    assert (
        Sl.check_auto_saving_time(registry(tmp_path / "d.xcu", save, "AutoSaveTimeIntervall", "10"), {"minutes": 3})
        == 0.0
    )
    assert Sl.check_left_panel('<desktop><document-frame name="Slides View"/></desktop>') == 1.0
    assert Sl.check_left_panel('<desktop><document-frame name="Outline"/></desktop>') == 0.0
