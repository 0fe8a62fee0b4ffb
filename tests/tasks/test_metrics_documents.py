"""Document metrics on .docx files built with python-docx (and small .odt / EPUB archives)."""

import io
import zipfile

import pytest
from docx import Document
from docx.enum.text import WD_BREAK, WD_COLOR_INDEX, WD_PARAGRAPH_ALIGNMENT, WD_TAB_ALIGNMENT
from docx.oxml import parse_xml
from docx.shared import Pt, RGBColor
from PIL import Image

from cua_jax.tasks.metrics import JudgeError
from cua_jax.tasks.metrics import documents as Dm


def docx(path, paragraphs=(), build=None):
    document = Document()
    for text in paragraphs:
        document.add_paragraph(text)
    if build:
        build(document)
    document.save(path)
    return str(path)


def png_bytes(colour):
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), colour).save(buffer, format="PNG")
    buffer.seek(0)
    return buffer


def odt(path, paragraphs, highlighted=False):
    style = (
        '<office:automatic-styles><style:style style:name="T1" style:family="text">'
        '<style:text-properties fo:background-color="#ffff00"/></style:style></office:automatic-styles>'
    )
    body = "".join(f"<text:p>{p}</text:p>" for p in paragraphs)
    if highlighted:
        body += '<text:p>see <text:span text:style-name="T1">this</text:span></text:p>'
    content = (
        '<?xml version="1.0" encoding="UTF-8"?><office:document-content '
        'xmlns:office="urn:oasis:names:tc:opendocument:xmlns:office:1.0" '
        'xmlns:style="urn:oasis:names:tc:opendocument:xmlns:style:1.0" '
        'xmlns:text="urn:oasis:names:tc:opendocument:xmlns:text:1.0" '
        'xmlns:fo="urn:oasis:names:tc:opendocument:xmlns:xsl-fo-compatible:1.0">'
        f"{style}<office:body><office:text>{body}</office:text></office:body></office:document-content>"
    )
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("mimetype", "application/vnd.oasis.opendocument.text")
        archive.writestr("content.xml", content)
    return str(path)


TEXT = ["First  paragraph", "", "Second paragraph"]


def test_compare_docx_files_options(tmp_path):
    expected = docx(tmp_path / "e.docx", TEXT)
    assert Dm.compare_docx_files(docx(tmp_path / "same.docx", TEXT), expected) == 1.0
    spaced = docx(tmp_path / "spaced.docx", ["First paragraph", "Second paragraph"])
    assert Dm.compare_docx_files(spaced, expected) == 1.0  # whitespace runs collapse (ignore_blanks)
    assert Dm.compare_docx_files(spaced, expected, ignore_blanks=False) == 0.0
    assert Dm.compare_docx_files(spaced, expected, ignore_blanks=False, delete_empty_lines=True) == 0.0
    assert (
        Dm.compare_docx_files(
            docx(tmp_path / "e2.docx", ["First  paragraph", "Second paragraph"]),
            expected,
            ignore_blanks=False,
            delete_empty_lines=True,
        )
        == 1.0
    )
    swapped = docx(tmp_path / "swapped.docx", list(reversed(TEXT)))
    assert Dm.compare_docx_files(swapped, expected) == 0.0
    assert Dm.compare_docx_files(swapped, expected, ignore_order=True) == 1.0
    upper = docx(tmp_path / "upper.docx", [t.upper() for t in TEXT])
    assert Dm.compare_docx_files(upper, expected) == 0.0
    assert Dm.compare_docx_files(upper, expected, ignore_case=True) == 1.0
    typo = docx(tmp_path / "typo.docx", ["First  paragraph", "", "Second paragraf"])
    assert 0.9 < Dm.compare_docx_files(typo, expected, fuzzy_match=True) < 1.0
    assert 0.9 < Dm.compare_docx_files(typo, expected, content_only=True) < 1.0
    assert 0.5 < Dm.compare_docx_files(typo, expected, ignore_blanks=False, fuzzy_match=True) < 1.0
    assert Dm.compare_docx_files(str(tmp_path / "absent.docx"), expected) == 0.0
    assert Dm.compare_docx_files(odt(tmp_path / "x.odt", TEXT), expected) == 0.0  # another kind of file
    with pytest.raises(JudgeError, match="missing"):
        Dm.compare_docx_files(expected, str(tmp_path / "absent.docx"))


def test_compare_odt_files_and_highlighted_words(tmp_path):
    expected = odt(tmp_path / "e.odt", ["a b", "c"], highlighted=False)
    assert Dm.odt_paragraphs(odt(tmp_path / "h.odt", ["a"], highlighted=True)) == ["a", "see this"]
    assert Dm.compare_docx_files(odt(tmp_path / "r.odt", ["a  b", "c"]), expected) == 1.0
    assert Dm.compare_docx_files(odt(tmp_path / "w.odt", ["a b", "d"]), expected) == 0.0
    gold = odt(tmp_path / "g.odt", ["x"], highlighted=True)
    assert (
        Dm.check_highlighted_words(odt(tmp_path / "clean.odt", ["x"], highlighted=False), gold) == 0.0
    )  # text differs
    plain_gold = odt(tmp_path / "pg.odt", ["x", "see this"])
    assert Dm.check_highlighted_words(odt(tmp_path / "ok.odt", ["x", "see this"]), plain_gold) == 1.0
    assert Dm.check_highlighted_words(odt(tmp_path / "hl.odt", ["x"], highlighted=True), plain_gold) == 0.0


def test_paragraph_and_line_comparisons(tmp_path):
    expected = docx(tmp_path / "e.docx", ["a", "b", "c"])
    assert Dm.compare_init_lines(docx(tmp_path / "r.docx", ["a", "b", "c", "d"]), expected) == 1.0
    assert Dm.compare_init_lines(docx(tmp_path / "w.docx", ["a", "x"]), expected) == 0.0
    assert Dm.compare_docx_lines(docx(tmp_path / "l.docx", [" c", "a", "", "b"]), expected) == 1.0
    assert Dm.compare_docx_lines(docx(tmp_path / "m.docx", ["a", "b"]), expected) == 0.0
    assert Dm.compare_docx_files_and_ignore_new_lines(docx(tmp_path / "n.docx", ["a", "", "b", "c"]), expected) == 1.0
    assert (
        Dm.compare_docx_files_and_ignore_new_lines(
            docx(tmp_path / "o.docx", ["a b", "c"]), expected, ignore_blanks=False
        )
        == 0.0
    )


def table_doc(cells):
    def build(document):
        table = document.add_table(rows=len(cells), cols=len(cells[0]))
        for i, row in enumerate(cells):
            for j, value in enumerate(row):
                table.cell(i, j).text = value

    return build


def test_compare_docx_tables(tmp_path):
    expected = docx(tmp_path / "e.docx", build=table_doc([["a", "b"], ["1", "2"]]))
    assert (
        Dm.compare_docx_tables(docx(tmp_path / "r.docx", build=table_doc([["a ", "b"], ["1", "2"]])), expected) == 1.0
    )
    assert Dm.compare_docx_tables(docx(tmp_path / "w.docx", build=table_doc([["a", "b"], ["1", "3"]])), expected) == 0.0
    assert Dm.compare_docx_tables(docx(tmp_path / "n.docx", ["a"]), expected) == 0.0


def test_images_equations_and_drawings(tmp_path):
    def picture(colour):
        return lambda document: document.add_paragraph().add_run().add_picture(png_bytes(colour))

    expected = docx(tmp_path / "e.docx", build=picture("red"))
    assert Dm.compare_docx_images(docx(tmp_path / "r.docx", build=picture("red")), expected) == 1.0
    assert Dm.compare_docx_images(docx(tmp_path / "w.docx", build=picture("blue")), expected) == 0.0
    assert Dm.compare_contains_image(docx(tmp_path / "r2.docx", build=picture("blue")), expected) == 1.0
    assert Dm.compare_contains_image(docx(tmp_path / "t.docx", ["text"]), expected) == 0.0

    def equation(document):
        run = document.add_paragraph("x").runs[0]
        run._r.append(parse_xml('<w:object xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"/>'))

    with_equation = docx(tmp_path / "eq.docx", build=equation)
    assert Dm.compare_insert_equation(docx(tmp_path / "eq2.docx", build=equation), with_equation) == 1.0
    assert Dm.compare_insert_equation(docx(tmp_path / "plain.docx", ["x"]), with_equation) == 0.0


def test_formatting_checks(tmp_path):
    def spaced(values):
        def build(document):
            for text, spacing in zip(["intro", "body", "end"], values):
                document.add_paragraph(text).paragraph_format.line_spacing = spacing

        return build

    good = docx(tmp_path / "s.docx", build=spaced([1.0, 2.0, 1.5]))
    assert Dm.evaluate_spacing(good) == 1.0
    assert Dm.evaluate_spacing(docx(tmp_path / "s2.docx", build=spaced([1.0, 1.0, 1.5]))) == 0.0
    assert Dm.compare_line_spacing(docx(tmp_path / "s3.docx", build=spaced([1.0, 2.0, 1.5])), good) == 1.0
    assert Dm.compare_line_spacing(docx(tmp_path / "s4.docx", build=spaced([1.0, 2.0, 2.0])), good) == 0.0

    def runs(**font):
        def build(document):
            run = document.add_paragraph().add_run("word")
            for key, value in font.items():
                setattr(run.font, key, value)

        return build

    assert Dm.compare_font_names(docx(tmp_path / "f.docx", build=runs(name="Arial")), {"font_name": "Arial"}) == 1.0
    assert Dm.compare_font_names(docx(tmp_path / "f2.docx", build=runs(name="Times")), {"font_name": "Arial"}) == 0.0
    sub = docx(tmp_path / "sub.docx", build=runs(subscript=True))
    assert Dm.compare_subscript_contains(docx(tmp_path / "sub2.docx", build=runs(subscript=True)), sub) == 1.0
    assert Dm.compare_subscript_contains(docx(tmp_path / "sub3.docx", build=runs()), sub) == 0.0
    italic = docx(tmp_path / "i.docx", build=runs(italic=True, size=Pt(14)))
    assert Dm.check_italic_font_size_14(docx(tmp_path / "i2.docx", build=runs(italic=True, size=Pt(14))), italic) == 1.0
    assert Dm.check_italic_font_size_14(docx(tmp_path / "i3.docx", build=runs(italic=True, size=Pt(12))), italic) == 0.0
    struck = docx(tmp_path / "k.docx", build=runs(strike=True))
    assert Dm.evaluate_strike_through_last_paragraph(docx(tmp_path / "k2.docx", build=runs(strike=True)), struck) == 1.0
    assert Dm.evaluate_strike_through_last_paragraph(docx(tmp_path / "k3.docx", build=runs()), struck) == 0.0
    assert Dm.evaluate_conversion(docx(tmp_path / "lower.docx", ["all lower case"])) == 1.0
    assert Dm.evaluate_conversion(docx(tmp_path / "upper.docx", ["SHOUTING"])) == 0.0


def test_highlighted_text_and_coloured_words(tmp_path):
    def highlight(word):
        def build(document):
            paragraph = document.add_paragraph("plain ")
            paragraph.add_run(word).font.highlight_color = WD_COLOR_INDEX.YELLOW

        return build

    expected = docx(tmp_path / "e.docx", build=highlight("key"))
    assert Dm.compare_highlighted_text(docx(tmp_path / "r.docx", build=highlight("key")), expected) == 1.0
    assert Dm.compare_highlighted_text(docx(tmp_path / "w.docx", build=highlight("other")), expected) == 0.0

    def coloured(apple, pear):
        def build(document):
            cell = document.add_table(rows=1, cols=1).cell(0, 0)
            paragraph = cell.paragraphs[0]
            paragraph.add_run("apple").font.color.rgb = RGBColor(*apple)
            paragraph.add_run("pear").font.color.rgb = RGBColor(*pear)

        return build

    gold = docx(tmp_path / "g.docx", build=coloured((255, 0, 0), (0, 0, 255)))
    near = docx(tmp_path / "n.docx", build=coloured((254, 1, 0), (0, 0, 250)))
    assert Dm.evaluate_colored_words_in_tables(near, gold) == 1.0
    assert (
        Dm.evaluate_colored_words_in_tables(docx(tmp_path / "x.docx", build=coloured((0, 0, 255), (0, 0, 255))), gold)
        == 0.0
    )


def test_layout_checks(tmp_path):
    def centred(document):
        document.add_paragraph("Title").alignment = WD_PARAGRAPH_ALIGNMENT.CENTER

    assert Dm.is_first_line_centered(docx(tmp_path / "c.docx", build=centred)) == 1.0
    assert Dm.is_first_line_centered(docx(tmp_path / "l.docx", ["Title"])) == 0.0

    def footer(text):
        return lambda document: setattr(document.sections[0].footer.paragraphs[0], "text", text)

    assert Dm.has_page_numbers_in_footers(docx(tmp_path / "p.docx", build=footer("Page 1"))) == 1.0
    assert Dm.has_page_numbers_in_footers(docx(tmp_path / "q.docx", build=footer("Page"))) == 0.0

    def page_break(document):
        document.add_paragraph("a").runs[0].add_break(WD_BREAK.PAGE)

    broken = docx(tmp_path / "b.docx", build=page_break)
    assert Dm.contains_page_break(broken, {}) == 1.0
    assert Dm.contains_page_break(broken, {"page_break_count": 2}) == 0.0
    assert Dm.contains_page_break(docx(tmp_path / "nb.docx", ["a"]), {}) == 0.0
    assert Dm.evaluate_alignment(docx(tmp_path / "al.docx", ["one two three four five."])) == 1.0
    assert Dm.evaluate_alignment(docx(tmp_path / "al2.docx", ["one two\tthree four five."])) == 0.0


def test_check_tabstops(tmp_path):
    def tabbed(position, alignment=WD_TAB_ALIGNMENT.RIGHT, text="Name\tValue"):
        def build(document):
            document.add_paragraph(text).paragraph_format.tab_stops.add_tab_stop(Pt(position), alignment)

        return build

    expected = docx(tmp_path / "e.docx", build=tabbed(400))
    assert Dm.check_tabstops(docx(tmp_path / "r.docx", build=tabbed(400)), expected) == 1.0
    near = Dm.check_tabstops(docx(tmp_path / "n.docx", build=tabbed(390)), expected)
    assert 0.9 < near < 1.0
    assert Dm.check_tabstops(docx(tmp_path / "a.docx", build=tabbed(400, WD_TAB_ALIGNMENT.CENTER)), expected) == 0.0
    assert (
        Dm.check_tabstops(
            docx(tmp_path / "r2.docx", build=tabbed(400)), expected, word_number_split_by_tabstop=1, index=0
        )
        == 1.0
    )
    assert (
        Dm.check_tabstops(
            docx(tmp_path / "r3.docx", build=tabbed(400, text="Full Name\tValue")),
            expected,
            word_number_split_by_tabstop=1,
        )
        == 0.0
    )


def test_train_records(tmp_path):
    initial = docx(tmp_path / "i.docx", ["08:00:00, T1, S1, 1", "08:10:00, T2, S1, 2", "08:20:00, T1, S2, 1"])
    processed = docx(tmp_path / "p.docx", ["08:00:00, T1, S1, 1", "08:10:00, T2, S1, 2"])
    assert Dm.check_no_duplicates(initial, processed) == 1.0
    assert Dm.check_no_duplicates(initial, initial) == 0.0
    gold = docx(tmp_path / "g.docx", ["08:00:00, T1, S1, 1", "08:10:00, T2, S1, 2"])
    assert Dm.compare_unique_train_records(processed, [gold, initial]) == 1.0
    assert Dm.compare_unique_train_records(initial, [gold, initial]) == 0.0
    with pytest.raises(JudgeError, match=r"\[gold, initial\]"):
        Dm.compare_unique_train_records(processed, gold)


def test_compare_references_rescaled(tmp_path):
    expected = docx(tmp_path / "e.docx", ["Body", "References", "A. Author. Title one. 2020.", "B. Author. Title two."])
    assert (
        Dm.compare_references(
            docx(tmp_path / "r.docx", ["Text", "References", "A. Author. Title one. 2020.", "B. Author. Title two."]),
            expected,
        )
        == 1.0
    )
    assert Dm.compare_references(docx(tmp_path / "w.docx", ["Text", "References", "zzz", "qqq"]), expected) == 0.0
    assert Dm.compare_references(docx(tmp_path / "n.docx", ["Text"]), expected) == 0.0
    assert Dm.compare_references(docx(tmp_path / "n2.docx", ["Text"]), docx(tmp_path / "n3.docx", ["Other"])) == 1.0


def test_fuzzy_place_math(tmp_path):
    rules = {"expected": ["2", "4", "8"]}
    assert Dm.fuzzy_place_math(docx(tmp_path / "r.docx", ["2 4", "8"]), rules) == 1.0
    assert Dm.fuzzy_place_math(docx(tmp_path / "w.docx", ["2 4"]), rules) == 0.0


def test_find_default_font(tmp_path):
    xcu = (
        '<?xml version="1.0"?><oor:items xmlns:oor="http://openoffice.org/2001/registry">'
        '<item oor:path="/org.openoffice.Office.Writer/DefaultFont"><prop oor:name="Standard" oor:op="fuse">'
        "<value>{font}</value></prop></item></oor:items>"
    )
    path = tmp_path / "registrymodifications.xcu"
    path.write_text(xcu.format(font="Liberation Serif"))
    assert Dm.find_default_font(str(path), {"font_name": "Liberation Serif"}) == 1.0
    assert Dm.find_default_font(str(path), {"font_name": "Arial"}) == 0.0


def epub(path, chapter):
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("toc.ncx", "<ncx>\n<navPoint id='1'/>\n<text>Book</text>\n</ncx>")
        archive.writestr(
            "content.opf", "<package>\n<dc:identifier>random-id</dc:identifier>\n<title>Book</title>\n</package>"
        )
        archive.writestr("ch1.html", f"<html><body><p>{chapter}</p>\n<p>end</p></body></html>")
    return str(path)


def test_compare_epub(tmp_path):
    expected = epub(tmp_path / "e.epub", "Chapter one")
    assert Dm.compare_epub(epub(tmp_path / "r.epub", "Chapter one"), expected) == 1.0
    score = Dm.compare_epub(epub(tmp_path / "w.epub", "Chapter two"), expected)
    assert 0.0 < score < 1.0
    assert Dm.compare_epub(str(tmp_path / "absent.epub"), expected) == 0.0
