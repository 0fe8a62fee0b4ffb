# Single job: the spreadsheet metrics (compare_table's rules and plain table comparison).
"""Spreadsheet metrics: OSWorld's compare_table with its rules (openpyxl), and the plain
cell-by-cell comparison of csv / xlsx tables this project uses without rules."""

from __future__ import annotations

import csv
import datetime
import io
import math
import pathlib
import re
import unicodedata
import zipfile
from typing import Any
from xml.etree import ElementTree

from cua_jax.tasks.metrics.base import (
    JudgeError,
    MalformedFileError,
    expected_file,
    fuzzy_ratio,
    load_result,
    match_value,
    metric,
    rule,
)
from cua_jax.tasks.metrics.data import read_text_any_encoding

# ------------------------------------------------------------------------------------
# Plain tables: csv / xlsx cells as strings (standard library only)
# ------------------------------------------------------------------------------------

_NS = {
    "m": "http://schemas.openxmlformats.org/spreadsheetml/2006/main",
    "r": "http://schemas.openxmlformats.org/officeDocument/2006/relationships",
}


def _cell_index(ref: str) -> tuple[int, int]:
    match = re.fullmatch(r"([A-Z]+)(\d+)", ref or "")
    if not match:
        raise MalformedFileError(f"bad cell reference {ref!r} in the spreadsheet")
    column = 0
    for char in match.group(1):
        column = column * 26 + ord(char) - ord("A") + 1
    return column - 1, int(match.group(2)) - 1


def _sheet_targets(archive: zipfile.ZipFile) -> dict[str, str]:
    """Sheet name -> the sheet's XML part inside an xlsx archive, in workbook order."""
    rels = ElementTree.fromstring(archive.read("xl/_rels/workbook.xml.rels"))
    targets = {rel.get("Id"): rel.get("Target") for rel in rels}
    workbook = ElementTree.fromstring(archive.read("xl/workbook.xml"))
    sheets = workbook.find("m:sheets", _NS)
    if sheets is None:
        raise MalformedFileError("the workbook lists no sheets")
    parts = {}
    for sheet in sheets:
        target = targets.get(sheet.get(f"{{{_NS['r']}}}id"))
        if target is None:
            raise MalformedFileError(f"sheet {sheet.get('name')!r} has no part in the workbook's relationships")
        target = target.lstrip("/")
        parts[sheet.get("name")] = target if target.startswith("xl/") else "xl/" + target
    return parts


def _xlsx_sheets(path: str) -> dict[str, list[list[str]]]:
    """The cell values of every sheet of an xlsx file, as strings."""
    with zipfile.ZipFile(path) as archive:
        shared = []
        if "xl/sharedStrings.xml" in archive.namelist():
            root = ElementTree.fromstring(archive.read("xl/sharedStrings.xml"))
            shared = ["".join(t.text or "" for t in si.iter(f"{{{_NS['m']}}}t")) for si in root.findall("m:si", _NS)]
        sheets = {}
        for name, target in _sheet_targets(archive).items():
            root = ElementTree.fromstring(archive.read(target))
            rows: dict[int, dict[int, str]] = {}
            for cell in root.iter(f"{{{_NS['m']}}}c"):
                column, row = _cell_index(cell.get("r"))
                kind = cell.get("t", "n")
                value = cell.find("m:v", _NS)
                if kind == "s" and value is not None:
                    if not (value.text or "").isdigit() or int(value.text) >= len(shared):
                        raise MalformedFileError(f"cell {cell.get('r')} names no shared string: {value.text!r}")
                    text = shared[int(value.text)]
                elif kind == "inlineStr":
                    text = "".join(t.text or "" for t in cell.iter(f"{{{_NS['m']}}}t"))
                else:
                    text = value.text if value is not None and value.text is not None else ""
                rows.setdefault(row, {})[column] = text
            width = max((max(r) + 1 for r in rows.values() if r), default=0)
            height = max(rows, default=-1) + 1
            sheets[name] = [[rows.get(r, {}).get(c, "") for c in range(width)] for r in range(height)]
        return sheets


def read_table(path: str) -> list[list[list[str]]]:
    """The sheets of a csv or xlsx file, each a list of rows of string cells."""
    suffix = pathlib.Path(path).suffix.lower()
    if suffix == ".csv":
        with open(path, newline="", encoding="utf-8", errors="replace") as handle:
            return [list(csv.reader(handle))]
    if suffix == ".xlsx":
        return list(_xlsx_sheets(path).values())
    raise JudgeError(f"compare_table reads .csv and .xlsx files, not '{suffix}'")


def _normalise_cell(text: str) -> Any:
    text = text.strip()
    try:
        number = float(text)
    except ValueError:
        return text
    return round(number, 9) if math.isfinite(number) else text


def _normalise_sheet(rows: list[list[str]]) -> list[list[Any]]:
    cells = [[_normalise_cell(c) for c in row] for row in rows]
    for row in cells:
        while row and row[-1] == "":
            row.pop()
    while cells and not cells[-1]:
        cells.pop()
    return cells


def _compare_plain(result_path: str | None, expected_path: str | None) -> float:
    if expected_path is None:
        raise JudgeError("compare_table without rules needs an expected table")
    expected = [_normalise_sheet(s) for s in read_table(expected_file(expected_path, "expected table"))]
    result = load_result(read_table, result_path, "table")
    if result is None:
        return 0.0
    return float([_normalise_sheet(s) for s in result] == expected)


# ------------------------------------------------------------------------------------
# OSWorld's rules, on openpyxl workbooks
# ------------------------------------------------------------------------------------


def _load(path: str, values: bool):
    import warnings

    import openpyxl

    with warnings.catch_warnings():  # openpyxl warns of the extensions it drops (sparklines...)
        warnings.simplefilter("ignore", UserWarning)
        return openpyxl.load_workbook(path, data_only=values)


class _Books:
    """The result and expected workbooks, each loaded (lazily) with formulas and styles or
    with cached values, and OSWorld's sheet indices resolved against them."""

    def __init__(self, result_path: str, expected_path: str | None):
        self.paths = {"result": result_path, "expected": expected_path}
        self._books: dict[tuple[str, bool], Any] = {}
        self.book("result", False)  # raises for an unreadable result, the caller scores 0

    def book(self, which: str, values: bool = False):
        key = (which, values)
        if key not in self._books:
            path = self.paths[which]
            if path is None:
                raise JudgeError("a compare_table rule refers to the expected workbook, but the task names none")
            if which == "expected":
                try:
                    self._books[key] = _load(expected_file(path, "expected workbook"), values)
                except JudgeError:
                    raise
                except Exception as error:  # noqa: BLE001
                    raise JudgeError(f"cannot read expected workbook {path}: {type(error).__name__}: {error}") from None
            else:
                self._books[key] = _load(path, values)
        return self._books[key]

    def names(self, which: str) -> list[str]:
        return list(self.book(which).sheetnames)

    def resolve(self, index: Any) -> tuple[str, str | None]:
        """OSWorld's sheet index: an int (a result sheet by position), "RI<n>" / "EI<n>" (the
        result / expected sheet by position) or "RN<name>" / "EN<name>" (by name). The
        sheet name is None when there is no such sheet."""
        if isinstance(index, bool) or not isinstance(index, (int, str)):
            raise JudgeError(f"bad sheet index {index!r}: an int or a string RI<n>, RN<name>, EI<n>, EN<name>")
        if isinstance(index, int):
            which, position = "result", index
        elif index[:2] in ("RI", "EI"):
            which = "result" if index[0] == "R" else "expected"
            try:
                position = int(index[2:])
            except ValueError:
                raise JudgeError(f"bad sheet index {index!r}: {index[:2]} needs a number") from None
        elif index[:2] in ("RN", "EN"):
            which = "result" if index[0] == "R" else "expected"
            name = index[2:]
            return which, name if name in self.names(which) else None
        else:
            raise JudgeError(f"bad sheet index {index!r}: an int or a string RI<n>, RN<name>, EI<n>, EN<name>")
        names = self.names(which)
        return which, names[position] if -len(names) <= position < len(names) else None

    def sheet(self, index: Any, values: bool = False):
        which, name = self.resolve(index)
        return None if name is None else self.book(which, values)[name]

    def path_of(self, index: Any) -> tuple[str, str | None]:
        which, name = self.resolve(index)
        return self.paths[which], name


def osworld_cell_value(value: Any) -> Any:
    """A cached cell value as OSWorld's raw-XML reader gives it: numbers (dates too, as
    spreadsheet serials) as floats, text as str, booleans and empty cells as None."""
    from openpyxl.utils.datetime import to_excel

    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time, datetime.timedelta)):
        return float(to_excel(value))
    return str(value)


def _cell_value(books: _Books, index: Any, coordinate: str) -> Any:
    sheet = books.sheet(index, values=True)
    if sheet is None:
        return None
    try:
        return osworld_cell_value(sheet[coordinate].value)
    except ValueError:
        raise JudgeError(f"bad cell coordinate {coordinate!r}") from None


def pandas_like_grid(sheet, precision: int) -> list[list[Any]]:
    """A sheet's cached values as pandas.read_excel sees them: from A1 to the last used
    cell, trailing empty cells and rows dropped, empty text as empty, numbers rounded to
    `precision` decimals (integers and floats compare by value)."""
    rows = []
    for row in sheet.iter_rows(values_only=True):
        cells = [None if value == "" else value for value in row]
        cells = [
            round(float(v), precision) if isinstance(v, (int, float)) and not isinstance(v, bool) else v for v in cells
        ]
        while cells and cells[-1] is None:
            cells.pop()
        rows.append(cells)
    while rows and not rows[-1]:
        rows.pop()
    width = max((len(r) for r in rows), default=0)
    return [r + [None] * (width - len(r)) for r in rows]


def _printed(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, float):
        return f"{value:.15g}"
    if isinstance(value, datetime.datetime) and value.time() == datetime.time():
        return value.date().isoformat()
    return str(value)


def printed_lines(path: str, sheet, sheet_name: str) -> list[str]:
    """A sheet as CSV lines, stripped, trailing empty lines dropped. OSWorld's getters leave
    LibreOffice's CSV export of each sheet beside the workbook as <stem>-<sheet>.csv; that
    file is used when present, else the cached values are written out as CSV."""
    export = pathlib.Path(path).with_name(f"{pathlib.Path(path).stem}-{sheet_name}.csv")
    if export.is_file():
        lines = read_text_any_encoding(str(export)).splitlines()
    else:
        buffer = io.StringIO()
        writer = csv.writer(buffer, lineterminator="\n")
        for row in pandas_like_grid(sheet, precision=15):
            writer.writerow([_printed(v) for v in row])
        lines = buffer.getvalue().splitlines()
    lines = [line.strip() for line in lines]
    while lines and not lines[-1]:
        lines.pop()
    return lines


_X14 = "http://schemas.microsoft.com/office/spreadsheetml/2009/9/main"
_XM = "http://schemas.microsoft.com/office/excel/2006/main"


def sparklines(path: str, sheet_name: str | None) -> dict[str, str]:
    """The sparklines of a sheet: {cell range: data range}, e.g. {"F3": "Sheet1!C3:E3"}."""
    if sheet_name is None:
        return {}
    try:
        with zipfile.ZipFile(path) as archive:
            target = _sheet_targets(archive).get(sheet_name)
            if target is None:
                return {}
            root = ElementTree.fromstring(archive.read(target))
    except (zipfile.BadZipFile, KeyError, ElementTree.ParseError):
        return {}
    found = {}
    for line in root.iter(f"{{{_X14}}}sparkline"):
        where, data = line.find(f"{{{_XM}}}sqref"), line.find(f"{{{_XM}}}f")
        if where is not None and data is not None:
            found[where.text] = data.text
    return found


def _rich_title(title) -> Any:
    try:
        return title.tx.rich.p[0].r[0].t
    except (AttributeError, IndexError, TypeError):
        return None


def charts(sheet, props: list[str]) -> dict[str, dict[str, Any]]:
    """The charts of a sheet, keyed by their series' data references
    ("values,categories;..."), each with the requested properties: title, legend,
    anchor, width, height, type, direction, xtitle, ytitle, ztitle."""
    if sheet is None:
        return {}

    def reference(source) -> str:
        for kind in ("numRef", "strRef"):
            ref = getattr(source, kind, None)
            if ref is not None and getattr(ref, "f", None) is not None:
                return ref.f
        return ""

    found = {}
    for chart in sheet._charts:
        key = ";".join(f"{reference(s.val)},{reference(s.cat)}" for s in chart.series)
        info: dict[str, Any] = {}
        for prop in props:
            if prop == "title":
                info[prop] = _rich_title(chart.title)
            elif prop == "legend":
                info[prop] = chart.legend.position if chart.legend is not None else None
            elif prop == "anchor":
                anchor = chart.anchor
                # OSWorld's tuple: edit mode, from-column, then to-row, to-column, to-row.
                info[prop] = [
                    getattr(anchor, "editAs", None),
                    anchor._from.col,
                    anchor.to.row,
                    anchor.to.col,
                    anchor.to.row,
                ]
            elif prop in ("width", "height"):
                info[prop] = getattr(chart, prop)
            elif prop == "type":
                info[prop] = chart.tagname
            elif prop == "direction":
                info[prop] = getattr(chart, "barDir", None)
            elif prop in ("xtitle", "ytitle", "ztitle"):
                axis = getattr(chart, f"{prop[0]}_axis", None)
                info[prop] = _rich_title(getattr(axis, "title", None))
            else:
                raise JudgeError(f"unknown chart property {prop!r}")
        found[key] = info
    return found


def pivot_tables(sheet, props: list[str]) -> dict[str, dict[str, Any]]:
    """The pivot tables of a sheet keyed by their source, with the requested properties
    (OSWorld's: name, show_total, show_empty_row, show_empty_col, show_headers, location,
    selection / filter (+ "ordered"), col_fields, row_fields, data_fields (+ data_fields_name))."""
    from openpyxl.utils import coordinate_to_tuple

    if sheet is None:
        return {}
    found = {}
    for pivot in sheet._pivots:
        raw = [[(item.h, item.x) for item in field.items if item.x is not None] for field in pivot.pivotFields]
        left = next((i for i, r in enumerate(raw) if r), len(raw))
        trimmed = raw[left:]
        right = next((i for i, r in enumerate(reversed(trimmed)) if r), len(trimmed))
        selection = trimmed[: len(trimmed) - right]
        source = pivot.cache.cacheSource
        first, last = source.worksheetSource.ref.split(":")
        first_cell, last_cell = coordinate_to_tuple(first), coordinate_to_tuple(last)
        first_cell = (first_cell[0], first_cell[1] + left)
        last_cell = (last_cell[0], last_cell[1] - right)
        key = f"{source.type};{first_cell}:{last_cell};{source.worksheetSource.sheet}"
        info: dict[str, Any] = {}
        simple = {
            "name": "name",
            "show_total": "visualTotals",
            "show_empty_row": "showEmptyRow",
            "show_empty_col": "showEmptyCol",
            "show_headers": "showHeaders",
            "location": "location",
        }
        for prop, attribute in simple.items():
            if prop in props:
                info[prop] = getattr(pivot, attribute)
        if "filter" in props or "selection" in props:
            info["selection"] = selection if "ordered" in props else [set(r) for r in selection]
        if "filter" in props:
            info["filter_fields"] = {f.fld for f in pivot.pageFields}
        if "col_fields" in props:
            info["col_fields"] = [f.x - left for f in pivot.colFields]
        if "row_fields" in props:
            info["row_fields"] = [f.x - left for f in pivot.rowFields]
        if "data_fields" in props:
            named = "data_fields_name" in props
            info["data_fields"] = [
                f"{f.fld - left:d};{f.name if named else ''};{f.subtotal};{f.showDataAs}" for f in pivot.dataFields
            ]
        found[key] = info
    return found


def filters(sheet) -> dict[str, Any]:
    """A sheet's autofilter: its range, filter columns and sort state."""
    if sheet is None:
        return {}
    auto = sheet.auto_filter
    columns = []
    for column in auto.filterColumn:
        entry: dict[str, Any] = {
            "col_id": column.colId,
            "hidden_button": column.hiddenButton,
            "show_button": column.showButton,
        }
        if column.filters is not None:
            entry["filters_blank"] = column.filters.blank
            entry["filters"] = set(column.filters.filter)
        if column.customFilters is not None:
            entry["custom_filters_op"] = column.customFilters._and
            entry["custom_filters"] = {(f.operator, f.val) for f in column.customFilters.customFilter}
        columns.append(entry)
    found: dict[str, Any] = {"ref": auto.ref, "filter_column": sorted(columns, key=lambda d: d["col_id"])}
    state = auto.sortState
    if state is not None:
        found["sort_state"] = {
            "sort": state.columnSort,
            "case": state.caseSensitive,
            "method": state.sortMethod,
            "ref": state.ref,
            "condition": [
                {
                    "descending": c.descending,
                    "key": c.sortBy,
                    "ref": c.ref,
                    "custom_list": c.customList,
                    "dxf_id": c.dxfId,
                    "icon": c.iconSet,
                    "iconid": c.iconId,
                }
                for c in state.sortCondition
            ],
        }
    return found


def dimensions(sheet, kind: str, props: list[str]) -> dict[Any, dict[str, Any]]:
    """Row ("row") or column ("column") properties: {index: {prop: value}}, e.g. hidden,
    height, width, outline_level."""
    if sheet is None:
        return {}
    holder = sheet.row_dimensions if kind == "row" else sheet.column_dimensions
    found = {}
    for key, dimension in holder.items():
        try:
            found[key] = {prop: getattr(dimension, prop) for prop in props}
        except AttributeError as error:
            raise JudgeError(f"unknown {kind} property: {error}") from None
    return found


def freeze_key(sheet) -> tuple:
    """A sheet's frozen panes as (state, frozen columns, frozen rows), independent of where
    the unfrozen part is scrolled to."""
    pane = sheet.sheet_view.pane
    if pane is None:
        return ("none",)
    state = (pane.state or "").lower()
    columns = int(pane.xSplit) if pane.xSplit is not None else 0
    rows = int(pane.ySplit) if pane.ySplit is not None else 0
    if state in ("frozen", "frozensplit"):
        return ("frozen", columns, rows)
    return ("other", columns, rows, pane.topLeftCell)


STYLE_PROPS = (
    "number_format",
    "font_name",
    "font_family",
    "font_color",
    "font_bold",
    "font_italic",
    "font_underline",
    "font_size",
    "fill_type",
    "bgcolor",
    "fgcolor",
    "hyperlink",
    "merge",
)


def cell_style(name: str, cell, differential=None) -> Any:
    """One style property of a cell (OSWorld's names, STYLE_PROPS), or of a conditional
    format's differential style applied to it. Font properties of an empty cell are None."""
    from openpyxl.cell.cell import MergedCell

    source = differential if differential is not None else cell
    empty = cell.value is None
    try:
        if name == "number_format":
            if empty or cell.data_type != "n":
                return None
            return cell.number_format if differential is None else differential.numFmt.formatCode
        if name.startswith("font_"):
            if empty:
                return None
            font = source.font
            if name == "font_color":
                return font.color.rgb if font.color is not None else None
            return getattr(
                font,
                {
                    "font_name": "name",
                    "font_family": "family",
                    "font_bold": "bold",
                    "font_italic": "italic",
                    "font_underline": "underline",
                    "font_size": "size",
                }[name],
            )
        if name == "fill_type":
            return source.fill.tagname
        if name in ("bgcolor", "fgcolor"):
            return differential.fill.bgColor.rgb if differential is not None else cell.fill.fgColor.rgb
    except (AttributeError, KeyError):
        return None
    if name == "hyperlink":
        if cell.hyperlink is not None:
            return (cell.hyperlink.target, cell.hyperlink.location)
        return None if empty else ""
    if name == "merge":
        return isinstance(cell, MergedCell)
    raise JudgeError(f"unknown cell style {name!r}; known: {list(STYLE_PROPS)}")


_ERRORS = {"#NULL!", "#DIV/0!", "#VALUE!", "#REF!", "#NAME?", "#NUM!", "#N/A"}


def _formula_constant(books: _Books, index: Any, formula: str) -> Any:
    text = formula.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1].replace('""', '"')
    try:
        return float(text)
    except ValueError:
        pass
    match = re.fullmatch(r"\$?([A-Z]{1,3})\$?(\d+)", text)
    if match:
        return _cell_value(books, index, match.group(1) + match.group(2))
    raise JudgeError(
        f"conditional format formula {formula!r} cannot be evaluated here "
        f"(numbers, quoted text and single cell references only)"
    )


def _cell_is(operator_name: str, value: Any, references: list) -> bool:
    try:
        if operator_name in ("between", "notBetween"):
            low, high = min(references), max(references)
            inside = low <= value <= high
            return inside if operator_name == "between" else not inside
        comparisons = {
            "lessThan": lambda a, b: a < b,
            "lessThanOrEqual": lambda a, b: a <= b,
            "greaterThan": lambda a, b: a > b,
            "greaterThanOrEqual": lambda a, b: a >= b,
            "equal": lambda a, b: a == b,
            "notEqual": lambda a, b: a != b,
        }
        if operator_name not in comparisons:
            raise JudgeError(f"unknown conditional format operator {operator_name!r}")
        return bool(comparisons[operator_name](value, references[0]))
    except (TypeError, IndexError, ValueError):
        return False


def _conditional_test(books: _Books, index: Any, cf_rule):
    kind = cf_rule.type
    if kind == "cellIs":
        references = [_formula_constant(books, index, f) for f in cf_rule.formula]
        return lambda value: _cell_is(cf_rule.operator, value, references)
    text = (cf_rule.text or "").lower()
    tests = {
        "containsText": lambda value: text in str(value).lower(),
        "notContainsText": lambda value: text not in str(value).lower(),
        "beginsWith": lambda value: str(value).lower().startswith(text),
        "endsWith": lambda value: str(value).lower().endswith(text),
        "containsErrors": lambda value: value in _ERRORS,
        "notContainsErrors": lambda value: value not in _ERRORS,
    }
    if kind not in tests:
        raise JudgeError(f"conditional formats of type {kind!r} cannot be evaluated here")
    return tests[kind]


def styles(books: _Books, index: Any, props: list[str]) -> dict[str, list[Any]]:
    """The requested style properties of every cell of a sheet, conditional formats
    applied to the cells whose values meet them."""
    from openpyxl.utils import get_column_letter

    sheet = books.sheet(index)
    if sheet is None:
        return {}
    found = {}
    for column in sheet.iter_cols():
        for cell in column:
            found[cell.coordinate] = [cell_style(p, cell) for p in props]
    for conditional in sheet.conditional_formatting:
        for cf_rule in conditional.rules:
            test = _conditional_test(books, index, cf_rule)
            for cell_range in conditional.cells:
                empty_run = 0
                for row, col in cell_range.cells:
                    coordinate = f"{get_column_letter(col)}{row}"
                    value = _cell_value(books, index, coordinate)
                    if value is None:
                        empty_run += 1
                        if empty_run > 50:
                            break
                        continue
                    empty_run = 0
                    if test(value):
                        cell = sheet[coordinate]
                        found[coordinate] = [cell_style(p, cell, cf_rule.dxf) for p in props]
    return found


def _fuzzy_cells(books: _Books, index0: Any, index1: Any, cell_rules: list) -> bool:
    from openpyxl.utils import get_column_letter
    from openpyxl.worksheet.cell_range import MultiCellRange

    for cell_rule in cell_rules:
        kind = cell_rule.get("type")
        if kind not in ("includes", "included_by", "fuzzy_match", "exact_match"):
            raise JudgeError(f"sheet_fuzzy rule type {kind!r} is not includes, included_by, fuzzy_match or exact_match")
        for cell_range in MultiCellRange(rule(cell_rule, "range")):
            for row, col in cell_range.cells:
                coordinate = f"{get_column_letter(col)}{row}"
                values = [str(_cell_value(books, i, coordinate)) for i in (index0, index1)]
                for old, new in cell_rule.get("normalization", []):
                    values = [v.replace(old, new) for v in values]
                if "trim_leadings" in cell_rule:
                    values = [v.lstrip(cell_rule["trim_leadings"]) for v in values]
                if "trim_trailings" in cell_rule:
                    values = [v.rstrip(cell_rule["trim_trailings"]) for v in values]
                if "ignore_chars" in cell_rule:
                    ignored = set(cell_rule["ignore_chars"])
                    values = ["".join(ch for ch in v if ch not in ignored) for v in values]
                if cell_rule.get("ignore_case", False):
                    values = [v.lower() for v in values]
                first, second = values
                if kind == "includes":
                    ok = second in first
                elif kind == "included_by":
                    ok = first in second
                elif kind == "fuzzy_match":
                    ok = fuzzy_ratio(first, second) * 100 >= cell_rule.get("threshold", 85.0)
                else:
                    ok = first == second
                if not ok:
                    return False
    return True


def _data_validations(sheet, wanted: list[dict]) -> bool:
    validations = sheet.data_validations.dataValidation
    if len(validations) < len(wanted):
        return False

    def meets(validation, props: dict) -> bool:
        try:
            return all(
                match_value(getattr(validation, attribute), value_rule) for attribute, value_rule in props.items()
            )
        except AttributeError as error:
            raise JudgeError(f"unknown data validation attribute: {error}") from None

    return all(any(meets(v, props) for props in wanted) for v in validations)


def _check_rule(books: _Books, spec: dict) -> bool:
    kind = rule(spec, "type")
    if kind == "sheet_name":
        return books.names("result") == books.names("expected")
    if kind == "sheet_data":
        precision = spec.get("precision", 4)
        sheets = [books.sheet(rule(spec, key), values=True) for key in ("sheet_idx0", "sheet_idx1")]
        if any(s is None for s in sheets):
            return False
        return pandas_like_grid(sheets[0], precision) == pandas_like_grid(sheets[1], precision)
    if kind == "sheet_print":
        lines = []
        for key in ("sheet_idx0", "sheet_idx1"):
            path, name = books.path_of(rule(spec, key))
            if name is None:
                return False
            lines.append(printed_lines(path, books.sheet(spec[key], values=True), name))
        if spec.get("ignore_case", False):
            lines = [[line.lower() for line in ls] for ls in lines]
        return lines[0] == lines[1]
    if kind == "sheet_fuzzy":
        return _fuzzy_cells(books, rule(spec, "sheet_idx0"), rule(spec, "sheet_idx1"), rule(spec, "rules"))
    if kind == "sparkline":
        return sparklines(*books.path_of(rule(spec, "sheet_idx0"))) == sparklines(
            *books.path_of(rule(spec, "sheet_idx1"))
        )
    if kind == "chart":
        props = spec.get("chart_props", [])
        return charts(books.sheet(rule(spec, "sheet_idx0")), props) == charts(
            books.sheet(rule(spec, "sheet_idx1")), props
        )
    if kind == "style":
        props = spec.get("props", [])
        return styles(books, rule(spec, "sheet_idx0"), props) == styles(books, rule(spec, "sheet_idx1"), props)
    if kind == "freeze":
        sheets = [books.sheet(rule(spec, key)) for key in ("sheet_idx0", "sheet_idx1")]
        return sheets[0] is not None and sheets[1] is not None and freeze_key(sheets[0]) == freeze_key(sheets[1])
    if kind == "zoom":
        sheet = books.sheet(rule(spec, "sheet_idx"))
        return sheet is not None and match_value(sheet.sheet_view.zoomScale or 100.0, spec)
    if kind == "data_validation":
        sheet = books.sheet(rule(spec, "sheet_idx"))
        return sheet is not None and _data_validations(sheet, rule(spec, "dv_props"))
    if kind in ("row_props", "col_props"):
        dimension = "row" if kind == "row_props" else "column"
        props = spec.get("props", [])
        return dimensions(books.sheet(rule(spec, "sheet_idx0")), dimension, props) == dimensions(
            books.sheet(rule(spec, "sheet_idx1")), dimension, props
        )
    if kind == "filter":
        return filters(books.sheet(rule(spec, "sheet_idx0"))) == filters(books.sheet(rule(spec, "sheet_idx1")))
    if kind == "pivot_table":
        props = spec.get("pivot_props", [])
        return pivot_tables(books.sheet(rule(spec, "sheet_idx0")), props) == pivot_tables(
            books.sheet(rule(spec, "sheet_idx1")), props
        )
    if kind == "check_cell":
        index, coordinate = rule(spec, "sheet_idx"), rule(spec, "coordinate")
        sheet = books.sheet(index)
        if sheet is None:
            return False
        for prop, value_rule in rule(spec, "props").items():
            value = _cell_value(books, index, coordinate) if prop == "value" else cell_style(prop, sheet[coordinate])
            if not match_value(value, value_rule):
                return False
        return True
    raise JudgeError(f"unknown compare_table rule type {kind!r}")


@metric(arity=2, required=1)
def compare_table(result_path: str | None, expected_path: str | None = None, rules: list | None = None, **_) -> float:
    """Compare spreadsheets.

    Without `rules`: 1 when two tables (csv / xlsx, any mix) hold the same cells in every
    sheet; numbers compare by value ("5" == "5.0"), trailing empty cells and rows are
    ignored.

    With `rules` (OSWorld's): an xlsx result (and, for rules that name it, the expected
    workbook) must pass every rule, in order. Sheets are named by OSWorld's indices (an
    int, "RI<n>", "RN<name>", "EI<n>", "EN<name>"). Rule types:
      sheet_name       the two workbooks' sheet names are equal;
      sheet_data       sheet_idx0 / sheet_idx1 hold the same cached values (numbers
                       rounded to `precision` decimals, default 4);
      sheet_print      ... the same printed lines (LibreOffice's CSV export beside the
                       workbook when there, else the values as CSV; `ignore_case`);
      sheet_fuzzy      per-cell rules {range, type: includes | included_by | fuzzy_match |
                       exact_match, threshold, ignore_case, ignore_chars, trim_leadings,
                       trim_trailings, normalization};
      sparkline, chart (chart_props), style (props; conditional formats with cellIs
                       constants or text tests), freeze, filter, pivot_table (pivot_props),
                       row_props / col_props (props): the two sheets agree on them;
      zoom             sheet_idx's zoom meets {method, ref};
      data_validation  every validation of sheet_idx meets one of dv_props;
      check_cell       sheet_idx's cell `coordinate` meets each of props
                       {value | a style: {method, ref}}.
    """
    if rules is None:
        return _compare_plain(result_path, expected_path)
    if not isinstance(rules, list) or not all(isinstance(r, dict) for r in rules):
        raise JudgeError(f"compare_table rules must be a list of objects, got {rules!r}")
    books = load_result(lambda path: _Books(path, expected_path), result_path, "xlsx")
    if books is None:
        return 0.0
    return float(all(_check_rule(books, spec) for spec in rules))


def _city(value: Any) -> str:
    """Lower case, accents removed, runs of anything but letters and digits as one space."""
    if value is None:
        return ""
    text = unicodedata.normalize("NFKD", str(value))
    text = "".join(ch for ch in text if not unicodedata.combining(ch))
    return re.sub(r"[^a-z0-9]+", " ", text.lower()).strip()


@metric()
def compare_conference_city_in_order(result_path: str | None, rules: dict) -> float:
    """1 when the active sheet's cells C2:C22 name, in order, the cities of
    rules['expected'] (each a name or a list of accepted names, matched as normalised
    substrings)."""
    cities = rule(rules, "expected")
    if not isinstance(cities, list):
        raise JudgeError(f"compare_conference_city_in_order needs a list rules['expected'], got {cities!r}")
    book = load_result(lambda path: _load(path, values=False), result_path, "xlsx")
    if book is None:
        return 0.0
    sheet = book.active
    actual = [cell.value for row in sheet["C2:C22"] for cell in row]
    for position, value in enumerate(actual):
        if position >= len(cities):
            return 0.0
        accepted = cities[position] if isinstance(cities[position], list) else [cities[position]]
        name = _city(value)
        if not any(_city(candidate) and _city(candidate) in name for candidate in accepted):
            return 0.0
    return 1.0
