"""compare_table (plain and with OSWorld's rules) and the other spreadsheet metric, on
workbooks built with openpyxl."""

import shutil
import types
import zipfile

import openpyxl
import pytest
from openpyxl.chart import BarChart, Reference
from openpyxl.formatting.rule import CellIsRule
from openpyxl.styles import Font, PatternFill
from openpyxl.worksheet.datavalidation import DataValidation

from cua_jax.tasks.metrics import JudgeError
from cua_jax.tasks.metrics import sheets as S

compare_table = S.compare_table


def book(path, rows, name="Sheet1", extra=None):
    workbook = openpyxl.Workbook()
    sheet = workbook.active
    sheet.title = name
    for row in rows:
        sheet.append(row)
    if extra:
        extra(workbook, sheet)
    workbook.save(path)
    return str(path)


ROWS = [["item", "qty", "price"], ["pear", 5, 1.23456], ["plum", 7, 2.5]]


def write(path, content):
    path.write_text(content)
    return str(path)


def test_plain_mode_compares_cells_of_csv_and_xlsx(tmp_path):
    expected = write(tmp_path / "e.csv", "item,qty,price\npear,5,1.23456\nplum,7,2.5\n")
    assert compare_table(book(tmp_path / "r.xlsx", ROWS), expected) == 1.0
    assert compare_table(book(tmp_path / "w.xlsx", ROWS[:2]), expected) == 0.0
    assert S.read_table(expected) == [[["item", "qty", "price"], ["pear", "5", "1.23456"], ["plum", "7", "2.5"]]]
    with pytest.raises(JudgeError, match="needs an expected table"):
        compare_table(expected, None)


def rewritten(source, path, part, edit):
    """A copy of the xlsx `source` with `part` replaced by edit(its bytes)."""
    with zipfile.ZipFile(source) as archive:
        parts = {name: archive.read(name) for name in archive.namelist()}
    parts[part] = edit(parts[part])
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in parts.items():
            archive.writestr(name, data)
    return str(path)


def test_a_malformed_result_workbook_scores_zero(tmp_path):
    """Workbooks an agent could craft by hand score 0 in both modes; none is a judge error."""
    expected = book(tmp_path / "e.xlsx", ROWS)
    good = book(tmp_path / "r.xlsx", ROWS)
    sheet, workbook = "xl/worksheets/sheet1.xml", "xl/workbook.xml"
    crafted = [
        rewritten(good, tmp_path / "ref.xlsx", sheet, lambda xml: xml.replace(b'r="A1"', b'r="1A"')),
        rewritten(
            good,
            tmp_path / "shared.xlsx",
            sheet,  # a shared string the workbook does not hold
            lambda xml: xml.replace(b'<c r="A1" t="inlineStr"><is><t>item</t></is>', b'<c r="A1" t="s"><v>9</v>'),
        ),
        rewritten(good, tmp_path / "rels.xlsx", workbook, lambda xml: xml.replace(b'r:id="rId1"', b'r:id="rId9"')),
        rewritten(good, tmp_path / "sheets.xlsx", workbook, lambda xml: xml.replace(b"sheets", b"sheetz")),
    ]
    for path in crafted:
        assert compare_table(path, expected) == 0.0, path
    # openpyxl reports a malformed attribute with a TypeError of its own: still the agent's file.
    typed = rewritten(
        good, tmp_path / "typed.xlsx", workbook, lambda xml: xml.replace(b'sheetId="1"', b'sheetId="one"')
    )
    assert compare_table(typed, expected, rules=[{"type": "sheet_name"}]) == 0.0
    assert S.compare_conference_city_in_order(typed, {"expected": ["Paris"]}) == 0.0
    assert (
        S.compare_conference_city_in_order(write(tmp_path / "junk.xlsx", "not a zip"), {"expected": ["Paris"]}) == 0.0
    )


def test_sheet_name_and_sheet_data_with_precision(tmp_path):
    expected = book(tmp_path / "e.xlsx", ROWS)
    rules = [{"type": "sheet_name"}, {"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
    assert compare_table(book(tmp_path / "r.xlsx", ROWS), expected, rules=rules) == 1.0
    close = [ROWS[0], ["pear", 5.0, 1.234561], ROWS[2]]
    assert compare_table(book(tmp_path / "c.xlsx", close), expected, rules=rules) == 1.0  # 4 decimals
    assert (
        compare_table(
            book(tmp_path / "c2.xlsx", close),
            expected,
            rules=[{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0", "precision": 6}],
        )
        == 0.0
    )
    assert compare_table(book(tmp_path / "n.xlsx", ROWS, name="Data"), expected, rules=rules) == 0.0
    assert compare_table(book(tmp_path / "w.xlsx", ROWS[:2]), expected, rules=rules[1:]) == 0.0
    assert compare_table(str(tmp_path / "absent.xlsx"), expected, rules=rules) == 0.0
    assert compare_table(write(tmp_path / "bad.xlsx", "not a workbook"), expected, rules=rules) == 0.0


def test_sheet_indices(tmp_path):
    expected = book(tmp_path / "e.xlsx", ROWS, name="Stock")
    result = book(tmp_path / "r.xlsx", ROWS, name="Stock")
    for first, second in (("RI0", "EI0"), ("RNStock", "ENStock"), (0, "ENStock")):
        assert (
            compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": first, "sheet_idx1": second}])
            == 1.0
        )
    assert (
        compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": "RNNope", "sheet_idx1": 0}]) == 0.0
    )
    with pytest.raises(JudgeError, match="bad sheet index"):
        compare_table(result, expected, rules=[{"type": "sheet_data", "sheet_idx0": "XX0", "sheet_idx1": 0}])
    with pytest.raises(JudgeError, match="names none"):
        compare_table(result, None, rules=[{"type": "sheet_data", "sheet_idx0": 0, "sheet_idx1": "EI0"}])
    with pytest.raises(JudgeError, match="unknown compare_table rule type"):
        compare_table(result, expected, rules=[{"type": "teleport"}])


def test_sheet_print_uses_exported_csv_when_present(tmp_path):
    expected = book(tmp_path / "e.xlsx", ROWS)
    result = book(tmp_path / "r.xlsx", ROWS)
    rules = [{"type": "sheet_print", "sheet_idx0": "RNSheet1", "sheet_idx1": "ENSheet1"}]
    assert compare_table(result, expected, rules=rules) == 1.0
    assert S.printed_lines(result, openpyxl.load_workbook(result)["Sheet1"], "Sheet1") == [
        "item,qty,price",
        "pear,5,1.23456",
        "plum,7,2.5",
    ]
    write(tmp_path / "r-Sheet1.csv", "item,qty,price\npear,5,1.23\nplum,7,2.50\n")  # LibreOffice's export
    write(tmp_path / "e-Sheet1.csv", "item,qty,price\npear,5,1.23\nplum,7,2.50\n\n")
    assert compare_table(result, expected, rules=rules) == 1.0
    write(tmp_path / "r-Sheet1.csv", "ITEM,qty,price\npear,5,1.23\nplum,7,2.50\n")
    assert compare_table(result, expected, rules=rules) == 0.0
    assert compare_table(result, expected, rules=[{**rules[0], "ignore_case": True}]) == 1.0


def test_sheet_fuzzy_cell_rules(tmp_path):
    expected = book(tmp_path / "e.xlsx", [["Main Road"], ["Apple Inc."]])
    result = book(tmp_path / "r.xlsx", [["main rd"], ["Apple"]])
    rule = {
        "type": "sheet_fuzzy",
        "sheet_idx0": "RI0",
        "sheet_idx1": "EI0",
        "rules": [
            {
                "range": ["A1"],
                "type": "exact_match",
                "ignore_case": True,
                "normalization": [["Rd", "Road"], ["rd", "road"]],
            },
            {"range": ["A2"], "type": "included_by"},
        ],
    }
    assert compare_table(result, expected, rules=[rule]) == 1.0
    rule["rules"][1]["type"] = "includes"
    assert compare_table(result, expected, rules=[rule]) == 0.0
    fuzzy = {**rule, "rules": [{"range": "A2", "type": "fuzzy_match", "threshold": 60, "ignore_chars": ". "}]}
    assert compare_table(result, expected, rules=[fuzzy]) == 1.0
    fuzzy["rules"][0]["threshold"] = 95
    assert compare_table(result, expected, rules=[fuzzy]) == 0.0


def test_check_cell_value_and_style_on_the_result_alone(tmp_path):
    def styled(workbook, sheet):
        sheet["A1"].font = Font(bold=True, color="FFFF0000", size=14)
        sheet["B2"].number_format = "0.00"

    result = book(tmp_path / "r.xlsx", ROWS, extra=styled)
    rule = {
        "type": "check_cell",
        "sheet_idx": 0,
        "coordinate": "A1",
        "props": {
            "value": {"method": "eq", "ref": "item"},
            "font_bold": {"method": "eq", "ref": True},
            "font_color": {"method": "eq", "ref": "FFFF0000"},
            "font_size": {"method": "eq", "ref": 14},
        },
    }
    number = {
        "type": "check_cell",
        "sheet_idx": 0,
        "coordinate": "B2",
        "props": {"value": {"method": "approx:0.001", "ref": 5}, "number_format": {"method": "eq", "ref": "0.00"}},
    }
    assert compare_table(result, rules=[rule, number]) == 1.0
    assert compare_table(result, rules=[{**rule, "coordinate": "A2"}]) == 0.0
    with pytest.raises(JudgeError, match="unknown cell style"):
        compare_table(result, rules=[{**rule, "props": {"glow": {"method": "eq", "ref": 1}}}])


def test_style_rule_with_conditional_formats(tmp_path):
    red = PatternFill(start_color="FFFF0000", end_color="FFFF0000", fill_type="solid")

    def conditional(threshold):
        def extra(workbook, sheet):
            sheet.conditional_formatting.add(
                "B2:B3", CellIsRule(operator="greaterThan", formula=[str(threshold)], fill=red)
            )

        return extra

    expected = book(tmp_path / "e.xlsx", ROWS, extra=conditional(6))
    rules = [{"type": "style", "sheet_idx0": 0, "sheet_idx1": "EI0", "props": ["font_bold", "bgcolor"]}]
    assert compare_table(book(tmp_path / "r.xlsx", ROWS, extra=conditional(6)), expected, rules=rules) == 1.0
    assert compare_table(book(tmp_path / "w.xlsx", ROWS, extra=conditional(4)), expected, rules=rules) == 0.0
    assert compare_table(book(tmp_path / "n.xlsx", ROWS), expected, rules=rules) == 0.0


def test_freeze_zoom_validation_dimensions_filter(tmp_path):
    def shaped(workbook, sheet):
        sheet.freeze_panes = "B2"
        sheet.sheet_view.zoomScale = 150
        validation = DataValidation(type="list", formula1='"low,high"', allow_blank=True)
        validation.add("D2:D3")
        sheet.add_data_validation(validation)
        sheet.column_dimensions["A"].width = 30
        sheet.row_dimensions[2].hidden = True
        sheet.auto_filter.ref = "A1:C3"

    expected = book(tmp_path / "e.xlsx", ROWS, extra=shaped)
    result = book(tmp_path / "r.xlsx", ROWS, extra=shaped)
    plain = book(tmp_path / "p.xlsx", ROWS)
    pair = {"sheet_idx0": 0, "sheet_idx1": "EI0"}
    rules = [
        {"type": "freeze", **pair},
        {"type": "filter", **pair},
        {"type": "col_props", **pair, "props": ["width"]},
        {"type": "row_props", **pair, "props": ["hidden"]},
        {"type": "zoom", "sheet_idx": 0, "method": "ge", "ref": 120},
        {
            "type": "data_validation",
            "sheet_idx": 0,
            "dv_props": [
                {
                    "type": {"method": "eq", "ref": "list"},
                    "formula1": {"method": "eq", "ref": '"low,high"'},
                    "sqref": {"method": "spreadsheet_range", "ref": ["D2:D3", "D1:D9"]},
                }
            ],
        },
    ]
    assert compare_table(result, expected, rules=rules) == 1.0
    for single in rules:
        assert compare_table(plain, expected, rules=[single]) == 0.0, single["type"]


def test_chart_rule(tmp_path):
    def chart(title):
        def extra(workbook, sheet):
            bar = BarChart()
            bar.title = title
            bar.add_data(Reference(sheet, min_col=2, min_row=1, max_row=3), titles_from_data=True)
            bar.set_categories(Reference(sheet, min_col=1, min_row=2, max_row=3))
            sheet.add_chart(bar, "E2")

        return extra

    expected = book(tmp_path / "e.xlsx", ROWS, extra=chart("Stock"))
    rules = [{"type": "chart", "sheet_idx0": 0, "sheet_idx1": "EI0", "chart_props": ["title", "type"]}]
    assert compare_table(book(tmp_path / "r.xlsx", ROWS, extra=chart("Stock")), expected, rules=rules) == 1.0
    assert compare_table(book(tmp_path / "w.xlsx", ROWS, extra=chart("Prices")), expected, rules=rules) == 0.0
    assert compare_table(book(tmp_path / "n.xlsx", ROWS), expected, rules=rules) == 0.0


_SPARKLINE_EXT = (
    '<extLst><ext uri="{05C60535-1F16-4fd2-B633-F4F36F0B64E0}" '
    'xmlns:x14="http://schemas.microsoft.com/office/spreadsheetml/2009/9/main">'
    '<x14:sparklineGroups xmlns:xm="http://schemas.microsoft.com/office/excel/2006/main">'
    "<x14:sparklineGroup><x14:sparklines><x14:sparkline><xm:f>Sheet1!B2:C2</xm:f><xm:sqref>{cell}</xm:sqref>"
    "</x14:sparkline></x14:sparklines></x14:sparklineGroup></x14:sparklineGroups></ext></extLst>"
)


def with_sparkline(source, target, cell):
    with zipfile.ZipFile(source) as original, zipfile.ZipFile(target, "w") as copy:
        for item in original.infolist():
            data = original.read(item.filename)
            if item.filename == "xl/worksheets/sheet1.xml":
                data = data.replace(b"</worksheet>", _SPARKLINE_EXT.replace("{cell}", cell).encode() + b"</worksheet>")
            copy.writestr(item, data)
    return str(target)


def test_sparkline_rule(tmp_path):
    plain = book(tmp_path / "p.xlsx", ROWS)
    expected = with_sparkline(plain, tmp_path / "e.xlsx", "D2")
    assert S.sparklines(expected, "Sheet1") == {"D2": "Sheet1!B2:C2"}
    rules = [{"type": "sparkline", "sheet_idx0": 0, "sheet_idx1": "EI0"}]
    assert compare_table(with_sparkline(plain, tmp_path / "r.xlsx", "D2"), expected, rules=rules) == 1.0
    assert compare_table(with_sparkline(plain, tmp_path / "w.xlsx", "D3"), expected, rules=rules) == 0.0
    shutil.copy(plain, tmp_path / "n.xlsx")
    assert compare_table(str(tmp_path / "n.xlsx"), expected, rules=rules) == 0.0


def test_pivot_table_properties():
    item = types.SimpleNamespace
    field = lambda *xs: item(items=[item(h=None, x=x) for x in xs])
    pivot = item(
        pivotFields=[field(), field(0, 1), field(0)],
        name="Pivot",
        visualTotals=True,
        showEmptyRow=False,
        showEmptyCol=False,
        showHeaders=True,
        location=item(ref="E1:F4"),
        pageFields=[],
        colFields=[],
        rowFields=[item(x=1)],
        dataFields=[item(fld=2, name="Sum of qty", subtotal="sum", showDataAs=None)],
        cache=item(cacheSource=item(type="worksheet", worksheetSource=item(ref="A1:C3", sheet="Sheet1"))),
    )
    sheet = item(_pivots=[pivot])
    found = S.pivot_tables(sheet, ["name", "row_fields", "data_fields", "selection"])
    assert found == {
        "worksheet;(1, 2):(3, 3);Sheet1": {
            "name": "Pivot",
            "selection": [{(None, 0), (None, 1)}, {(None, 0)}],
            "row_fields": [0],
            "data_fields": ["1;;sum;None"],
        }
    }


def test_cell_value_reads_like_osworld():
    import datetime

    assert S.osworld_cell_value(5) == 5.0 and S.osworld_cell_value("x") == "x"
    assert S.osworld_cell_value(True) is None and S.osworld_cell_value(None) is None
    assert S.osworld_cell_value(datetime.datetime(1900, 1, 10)) == 10.0


def test_compare_conference_city_in_order(tmp_path):
    cities = ["Scottsdale", ["Montreal", "Montréal"]] + [f"City {i}" for i in range(19)]  # C2:C22
    names = ["Scottsdale, AZ", "Montréal"] + [f"city {i}" for i in range(19)]
    rows = [["year", "conf", "city"]] + [[2000 + i, "c", name] for i, name in enumerate(names)]
    assert S.compare_conference_city_in_order(book(tmp_path / "r.xlsx", rows), {"expected": cities}) == 1.0
    rows[2][2] = "Toronto"
    assert S.compare_conference_city_in_order(book(tmp_path / "w.xlsx", rows), {"expected": cities}) == 0.0
