"""The accessibility tree on /accessibility: AT-SPI's, in OSWorld's XML form, where the image
runs an accessibility bus (the osworld image); the X window tree (display.py) elsewhere.

The XML is what OSWorld's Linux server (desktop_env/server/main.py) makes of pyatspi's
desktop:

    <desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state" ...>
      <application name="gnome-terminal-server" ...>
        <frame name="user@host: ~" st:active="true" st:showing="true" st:visible="true" ...
               cp:screencoord="(0, 0)" cp:size="(1280, 800)">
          ...<terminal name="Terminal" st:focused="true" ...>user@host:~$ </terminal>

Each node is an element named after its role, spaces as dashes ("push-button"), with
    name                            its accessible name
    st:<state>="true"               one per AT-SPI state (STATE_MULTI_LINE -> st:multi_line)
    attr:<key>                      its object attributes (toolkit, xml-roles, ...)
    cp:screencoord, cp:size         "(x, y)" and "(width, height)" in screen pixels, when
                                    the node is visible and showing
    image, selection                "true" when it has that interface
    val:value, val:min, val:max, val:step        its Value interface
    act:<action>_desc, act:<action>_kb           its actions' descriptions and key bindings
and its Text interface's text (U+FFFC and U+FFFD removed) as element text. Children go at
most MAX_DEPTH deep and MAX_WIDTH wide; a spreadsheet's table (LibreOffice Calc) lists only
the cells on screen, row by row from the top-left one. A walk also stops adding nodes after
MAX_NODES nodes or TIME_BUDGET seconds, so that a huge or hung application cannot stall the
endpoint; the tree is then partial.

`atspi_tree(application="gnome-terminal-server")` walks one application only (OSWorld's
/terminal reads the focused terminal's text from that part of the tree).

pyatspi is used without a GLib main loop, so libatspi caches nothing and every walk reads
the applications' current state over D-Bus. libatspi is not thread-safe: walks take turns.
"""

from __future__ import annotations

import os
import re
import sys
import threading
import time
from typing import Any

NAMESPACES = {  # OSWorld's namespace map for Ubuntu, prefix -> URI
    "st": "https://accessibility.ubuntu.example.org/ns/state",
    "attr": "https://accessibility.ubuntu.example.org/ns/attributes",
    "cp": "https://accessibility.ubuntu.example.org/ns/component",
    "doc": "https://accessibility.ubuntu.example.org/ns/document",
    "docattr": "https://accessibility.ubuntu.example.org/ns/document/attributes",
    "txt": "https://accessibility.ubuntu.example.org/ns/text",
    "val": "https://accessibility.ubuntu.example.org/ns/value",
    "act": "https://accessibility.ubuntu.example.org/ns/action",
}
MAX_DEPTH = 50
MAX_WIDTH = 1024
MAX_NODES = 20_000
TIME_BUDGET = 15.0  # under the 20-30 s call timeouts of the clients
CALC_SCAN = 64  # rows and columns searched for a spreadsheet's first cell on screen

_lock = threading.Lock()
_pyatspi: Any = None  # the module once imported; False when this environment has no AT-SPI
_INVALID_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_NOT_NAME = re.compile(r"[^A-Za-z0-9_.-]")


class AtspiUnavailable(RuntimeError):
    """No accessibility bus answers (none was started, or it died)."""


def _load() -> Any:
    global _pyatspi
    if _pyatspi is None:
        _pyatspi = False
        # Without a session bus (or an explicit accessibility bus) libatspi has nothing to
        # connect to; the plain desktop image also lacks pyatspi and sets NO_AT_BRIDGE.
        if os.environ.get("DBUS_SESSION_BUS_ADDRESS") or os.environ.get("AT_SPI_BUS_ADDRESS"):
            try:
                import pyatspi
            except (ImportError, ValueError):  # ValueError: gi lacks the Atspi typelib
                pass
            else:
                _pyatspi = pyatspi
    return _pyatspi or None


def atspi_available() -> bool:
    """True when pyatspi and a D-Bus session are there (the osworld image)."""
    return _load() is not None


def accessibility_tree(display: Any) -> str:
    """The XML for /accessibility: AT-SPI's tree in OSWorld's form where available, else the
    X window tree of `display` (cua_jax.envs.server.display.Display)."""
    if atspi_available():
        try:
            return atspi_tree()
        except AtspiUnavailable as error:
            print(f"[env-server] AT-SPI unavailable ({error}); the X window tree instead",
                  file=sys.stderr, flush=True)
    return display.accessibility_tree()


def atspi_tree(time_budget: float = TIME_BUDGET, max_nodes: int = MAX_NODES,
               application: str | None = None) -> str:
    """Every application on the accessibility bus (or only those named `application`), as
    OSWorld's XML. Raises AtspiUnavailable when pyatspi is missing or no accessibility bus
    answers."""
    pyatspi = _load()
    if pyatspi is None:
        raise AtspiUnavailable("pyatspi or the D-Bus session is missing")
    with _lock:
        try:
            desktop = pyatspi.Registry.getDesktop(0)
            applications = [desktop.get_child_at_index(i) for i in range(desktop.get_child_count())]
        except Exception as error:  # GLib.Error from libatspi's D-Bus calls
            raise AtspiUnavailable(f"{type(error).__name__}: {error}") from None
        walk = _Walk(pyatspi, time.monotonic() + time_budget, max_nodes)
        declarations = "".join(f' xmlns:{prefix}="{uri}"' for prefix, uri in NAMESPACES.items())
        out = [f"<desktop-frame{declarations}>"]
        for node in applications:
            if node is not None and (application is None or _name_of(node) == application):
                walk.node(node, 1, None, out)
        out.append("</desktop-frame>")
        if walk.truncated:
            print(f"[env-server] accessibility tree cut at {walk.count} nodes", file=sys.stderr, flush=True)
        return "".join(out)


def _name_of(node: Any) -> str | None:
    try:
        return node.get_name()
    except Exception:
        return None


def _clean(text: str) -> str:
    return _INVALID_XML.sub("", text)


def _xml_name(name: str) -> str:
    """A string as an XML name: other characters become '-', a leading non-letter gets 'x'."""
    name = _NOT_NAME.sub("-", name.strip()) or "unknown"
    return name if name[0].isalpha() or name[0] == "_" else "x" + name


def _attribute(value: str) -> str:
    return (_clean(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
            .replace('"', "&quot;").replace("\n", "&#10;").replace("\r", "&#13;").replace("\t", "&#9;"))


def _text(value: str) -> str:
    return _clean(value).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


class _Walk:
    """One walk over the tree, with its node and time budget."""

    def __init__(self, pyatspi: Any, deadline: float, max_nodes: int):
        self.pyatspi = pyatspi
        self.deadline, self.max_nodes = deadline, max_nodes
        self.count = 0
        self.truncated = False
        self.states = {number: label.split("_", 1)[1].lower()
                       for number, label in pyatspi.StateType._enum_lookup.items()}

    def spent(self) -> bool:
        if self.count >= self.max_nodes or time.monotonic() > self.deadline:
            self.truncated = True
        return self.truncated

    def describe(self, node: Any) -> tuple[str, dict[str, str], str]:
        """(role name, attributes, text) of one node, as OSWorld's server reads them."""
        pyatspi = self.pyatspi
        attributes = {"name": node.get_name() or ""}
        for state in node.get_state_set().get_states():
            label = self.states.get(int(state))
            if label:
                attributes[f"st:{label}"] = "true"
        try:
            for key, value in (node.get_attributes() or {}).items():
                if key:
                    attributes[f"attr:{_xml_name(key)}"] = str(value)
        except Exception:
            pass
        if attributes.get("st:visible") == "true" and attributes.get("st:showing") == "true":
            try:
                x, y, width, height = node.queryComponent().getExtents(pyatspi.XY_SCREEN)
                attributes["cp:screencoord"] = f"({x}, {y})"
                attributes["cp:size"] = f"({width}, {height})"
            except Exception:  # NotImplementedError: no Component interface
                pass
        text = ""
        try:
            text_iface = node.queryText()
            text = text_iface.getText(0, text_iface.characterCount).replace("\ufffc", "").replace("\ufffd", "")
        except Exception:
            pass
        for flag, query in (("image", node.queryImage), ("selection", node.querySelection)):
            try:
                query()
                attributes[flag] = "true"
            except Exception:
                pass
        try:
            value = node.queryValue()
            for key, read in (("value", lambda: value.currentValue), ("min", lambda: value.minimumValue),
                              ("max", lambda: value.maximumValue), ("step", lambda: value.minimumIncrement)):
                try:
                    attributes[f"val:{key}"] = str(read())
                except Exception:
                    pass
        except Exception:
            pass
        try:
            action = node.queryAction()
            for index in range(action.nActions):
                action_name = _xml_name(action.getName(index).replace(" ", "-"))
                attributes[f"act:{action_name}_desc"] = action.getDescription(index) or ""
                attributes[f"act:{action_name}_kb"] = action.getKeyBinding(index) or ""
        except Exception:
            pass
        return (node.get_role_name() or "").strip(), attributes, text

    def node(self, node: Any, depth: int, flag: str | None, out: list[str]) -> None:
        """Append `node` and its subtree to `out` (nothing when it vanished meanwhile)."""
        if self.spent():
            return
        self.count += 1
        try:
            role, attributes, text = self.describe(node)
        except Exception:  # the object (or its application) went away during the walk
            return
        tag = _xml_name((role or "unknown").replace(" ", "-"))
        if not flag and role == "document spreadsheet":
            flag = "calc"
        out.append(f"<{tag}" + "".join(f' {key}="{_attribute(value)}"' for key, value in attributes.items()))
        opening = len(out)
        out.append(">" + _text(text))
        if depth < MAX_DEPTH:
            if flag == "calc" and tag == "table":
                self.visible_cells(node, depth, flag, out)
            else:
                self.children(node, depth, flag, out)
        if len(out) == opening + 1 and not text:
            out[opening] = "/>"
        else:
            out.append(f"</{tag}>")

    def children(self, node: Any, depth: int, flag: str | None, out: list[str]) -> None:
        try:
            count = min(node.get_child_count(), MAX_WIDTH)
        except Exception:
            return
        for index in range(count):
            if self.spent():
                return
            try:
                child = node.get_child_at_index(index)
            except Exception:
                continue
            if child is not None:
                self.node(child, depth + 1, flag, out)

    def showing(self, node: Any) -> bool:
        try:
            return node.get_state_set().contains(self.pyatspi.STATE_SHOWING)
        except Exception:
            return False

    def visible_cells(self, table_node: Any, depth: int, flag: str, out: list[str]) -> None:
        """The cells of a spreadsheet's table that are on screen: a sheet has millions."""
        try:
            table = table_node.queryTable()
            rows, columns = table.nRows, table.nColumns
        except Exception:
            return
        start = self.first_visible_cell(table_node, table, rows, columns)
        if start is None:
            return
        first_row, first_column = start
        for row in range(first_row, rows):
            shown = 0
            for column in range(first_column, columns):
                if self.spent():
                    return
                try:
                    cell = table.getAccessibleAt(row, column)
                except Exception:
                    cell = None
                if cell is None or not self.showing(cell):
                    break
                self.node(cell, depth + 1, flag, out)
                shown += 1
            if not shown:
                return

    def first_visible_cell(self, table_node: Any, table: Any, rows: int, columns: int) -> tuple[int, int] | None:
        """(row, column) of the top-left cell on screen: the cell under the table's top-left
        corner, or else the first showing cell of a CALC_SCAN x CALC_SCAN search."""
        try:
            x, y, _, _ = table_node.queryComponent().getExtents(self.pyatspi.XY_SCREEN)
            cell = table_node.queryComponent().getAccessibleAtPoint(x + 1, y + 1, self.pyatspi.XY_SCREEN)
            if cell is not None and self.showing(cell):
                index = cell.get_index_in_parent()
                row, column = table.getRowAtIndex(index), table.getColumnAtIndex(index)
                if row >= 0 and column >= 0:
                    return row, column
        except Exception:
            pass
        for row in range(min(rows, CALC_SCAN)):
            for column in range(min(columns, CALC_SCAN)):
                if self.spent():
                    return None
                try:
                    cell = table.getAccessibleAt(row, column)
                except Exception:
                    continue
                if cell is not None and self.showing(cell):
                    return row, column
        return None
