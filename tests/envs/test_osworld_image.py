"""The osworld image (launch/images/osworld) and the os suite (cua_jax/tasks/suites/os).

Against a real dockerd: the image keeps OSWorld's conventions (user `user` with password
`password` and sudo, /home/user/Desktop, `python` with pyautogui, ctrl+alt+t opens a
terminal, LibreOffice, /accessibility in OSWorld's AT-SPI XML), and a pool of 4 runs every
suite task with its scripted solution (reward 1) and a near miss (reward 0).
"""

import concurrent.futures
import re
import types
import xml.etree.ElementTree as ET

import pytest

from cua_jax.environments.desktop_env import run_scripted
from cua_jax.envs import actions as A
from cua_jax.envs.docker_pool import DockerEnvPool, PoolConfig
from cua_jax.envs.images import ensure_image
from cua_jax.envs.server import accessibility
from cua_jax.envs.server.accessibility import NAMESPACES
from cua_jax.tasks.schema import load_suite
from cua_jax.tasks.suites.os.solutions import IMAGE, SOLUTIONS, SUITE_DIR, WRONG_SOLUTIONS
from cua_jax.types import EpisodeStatus

TASKS = {task.id: task for task in load_suite(SUITE_DIR)}
ST, CP, ATTR, VAL, ACT = (f"{{{NAMESPACES[prefix]}}}" for prefix in ("st", "cp", "attr", "val", "act"))


def test_suite_follows_osworld_layout_and_has_both_solutions():
    assert len(TASKS) >= 20
    assert set(TASKS) == set(SOLUTIONS) == set(WRONG_SOLUTIONS)
    for task in TASKS.values():
        assert task.snapshot == IMAGE and "os" in task.related_apps, task.id
        assert (SUITE_DIR / f"{task.id}.json").is_file()
        for text in SOLUTIONS[task.id] + WRONG_SOLUTIONS[task.id]:
            assert not isinstance(A.parse_action(text, "coordinates"), A.InvalidAction), (task.id, text)


class FakeNode:
    """An AT-SPI accessible as pyatspi presents it (only what accessibility.py reads)."""

    STATES = {"visible": 30, "showing": 25, "focused": 12, "active": 1, "multi_line": 17}

    def __init__(
        self,
        role,
        name="",
        states=(),
        children=(),
        extents=None,
        text=None,
        attributes=None,
        value=None,
        actions=(),
        table=None,
    ):
        self.role, self.name, self.states = role, name, [self.STATES[s] for s in states]
        self.children, self.extents, self.text = list(children), extents, text
        self.attributes, self.value, self.actions, self.table = attributes or {}, value, actions, table

    def get_name(self):
        return self.name

    def get_role_name(self):
        return self.role

    def get_state_set(self):
        return types.SimpleNamespace(get_states=lambda: self.states, contains=lambda state: state in self.states)

    def get_attributes(self):
        return self.attributes

    def get_child_count(self):
        return len(self.children)

    def get_child_at_index(self, index):
        return self.children[index]

    @staticmethod
    def _interface(value):
        if value is None:
            raise NotImplementedError
        return value

    def queryComponent(self):
        extents = self._interface(self.extents)
        at_point = (lambda x, y, kind: self.table.cell_at(x, y)) if self.table else None
        return types.SimpleNamespace(getExtents=lambda kind: list(extents), getAccessibleAtPoint=at_point)

    def queryText(self):
        text = self._interface(self.text)
        return types.SimpleNamespace(characterCount=len(text), getText=lambda start, end: text[start:end])

    def queryValue(self):
        low, current, high = self._interface(self.value)
        return types.SimpleNamespace(currentValue=current, minimumValue=low, maximumValue=high, minimumIncrement=1.0)

    def queryAction(self):
        names = self._interface(self.actions or None)
        return types.SimpleNamespace(
            nActions=len(names),
            getName=lambda i: names[i],
            getDescription=lambda i: f"{names[i]}s it",
            getKeyBinding=lambda i: "",
        )

    def queryTable(self):
        return self._interface(self.table)

    def queryImage(self):
        raise NotImplementedError

    querySelection = queryImage


class FakeSheet:
    """A spreadsheet's table: a million rows and 16384 columns, rows 4-6 and columns 2-4 on screen."""

    nRows, nColumns = 1_048_576, 16_384
    shown_rows, shown_columns = range(4, 7), range(2, 5)

    def __init__(self):
        self.reads = 0

    def getAccessibleAt(self, row, column):
        self.reads += 1
        showing = row in self.shown_rows and column in self.shown_columns
        cell = FakeNode(
            "table cell",
            f"{chr(65 + column)}{row + 1}",
            ("visible", "showing") if showing else (),
            extents=(100 * column, 20 * row, 100, 20),
            text=f"{row},{column}",
        )
        cell.get_index_in_parent = lambda: row * self.nColumns + column
        return cell

    def cell_at(self, x, y):
        return self.getAccessibleAt(self.shown_rows[0], self.shown_columns[0])

    def getRowAtIndex(self, index):
        return index // self.nColumns

    def getColumnAtIndex(self, index):
        return index % self.nColumns


def test_atspi_tree_is_osworld_xml(monkeypatch):
    sheet = FakeSheet()
    terminal = FakeNode(
        "terminal",
        "Terminal",
        ("visible", "showing", "focused", "multi_line"),
        extents=(0, 25, 1280, 775),
        text="user@host:~$ echo '<&>'\n\ufffc",
        actions=("menu",),
    )
    desktop = FakeNode(
        "desktop frame",
        children=[
            FakeNode(
                "application",
                "gnome-terminal-server",
                children=[
                    FakeNode(
                        "frame",
                        'user@host: ~ "home"',
                        ("visible", "showing", "active"),
                        extents=(0, 0, 1280, 800),
                        attributes={"toolkit": "gtk", "window-type": "normal"},
                        children=[
                            terminal,
                            FakeNode("scroll bar", "", ("visible",), extents=(1266, 25, 14, 775), value=(0, 3, 10)),
                            FakeNode("push button", "Close"),
                        ],
                    )
                ],
            ),
            FakeNode(
                "application",
                "soffice",
                children=[
                    FakeNode(
                        "document spreadsheet",
                        "Sheet",
                        ("visible", "showing"),
                        children=[
                            FakeNode("table", "Sheet1", ("visible", "showing"), extents=(0, 60, 1280, 700), table=sheet)
                        ],
                    )
                ],
            ),
        ],
    )
    fake = types.SimpleNamespace(
        Registry=types.SimpleNamespace(getDesktop=lambda index: desktop),
        XY_SCREEN=0,
        STATE_SHOWING=25,
        StateType=types.SimpleNamespace(
            _enum_lookup={number: f"STATE_{label.upper()}" for label, number in FakeNode.STATES.items()}
        ),
    )
    monkeypatch.setattr(accessibility, "_pyatspi", fake)
    xml = accessibility.atspi_tree()
    for prefix, uri in NAMESPACES.items():
        assert f' xmlns:{prefix}="{uri}"' in xml.split(">", 1)[0]
    root = ET.fromstring(xml)
    assert root.tag == "desktop-frame" and [a.get("name") for a in root] == ["gnome-terminal-server", "soffice"]
    frame = root[0][0]
    assert frame.tag == "frame" and frame.get("name") == 'user@host: ~ "home"'
    assert (frame.get(f"{ST}active"), frame.get(f"{ST}showing"), frame.get(f"{ATTR}window-type")) == (
        "true",
        "true",
        "normal",
    )
    assert (frame.get(f"{CP}screencoord"), frame.get(f"{CP}size")) == ("(0, 0)", "(1280, 800)")
    node = frame.find("terminal")
    assert node.text == "user@host:~$ echo '<&>'\n" and node.get(f"{ST}multi_line") == "true"
    assert node.get(f"{ACT}menu_desc") == "menus it" and node.get(f"{ACT}menu_kb") == ""
    scroll = frame.find("scroll-bar")  # visible but not showing: no extents; its Value interface
    assert scroll.get(f"{CP}size") is None and scroll.get(f"{VAL}value") == "3" and scroll.get(f"{VAL}max") == "10"
    assert '<push-button name="Close"/>' in xml
    cells = root[1].find("document-spreadsheet/table")
    assert [c.get("name") for c in cells] == ["C5", "D5", "E5", "C6", "D6", "E6", "C7", "D7", "E7"]
    assert sheet.reads < 20  # the cell under the table's corner, then the rows on screen

    only = ET.fromstring(accessibility.atspi_tree(application="soffice"))
    assert [a.get("name") for a in only] == ["soffice"]


def test_x_window_tree_where_no_accessibility_bus(monkeypatch):
    monkeypatch.setattr(accessibility, "_pyatspi", False)
    display = types.SimpleNamespace(accessibility_tree=lambda: '<desktop-frame name="root"/>')
    assert accessibility.accessibility_tree(display) == '<desktop-frame name="root"/>'
    with pytest.raises(accessibility.AtspiUnavailable):
        accessibility.atspi_tree()


@pytest.fixture(scope="module")
def pool():
    image = ensure_image(IMAGE)
    with DockerEnvPool(
        PoolConfig(image=image, size=4, cpus=1.0, memory="1536m", call_timeout=60.0, health_interval=5.0)
    ) as pool:
        yield pool


def run(client, command: str, timeout: float = 60.0) -> str:
    reply = client.execute(command, shell=True, timeout=timeout)
    assert reply["returncode"] == 0, (command, reply)
    return reply["output"]


@pytest.mark.docker
@pytest.mark.slow
def test_image_keeps_osworld_conventions(pool):
    env = pool.acquire(timeout=300)
    try:
        client = env.client
        assert re.match(r"uid=1000\(user\) gid=1000\(user\) groups=.*\(sudo\)", run(client, "id"))
        assert run(client, 'echo "$HOME"; test -d ~/Desktop && echo desktop') == "/home/user\ndesktop\n"
        assert run(client, "echo password | sudo -S -p '' id -u") == "0\n"
        assert client.execute("echo wrong | sudo -S -p '' true", shell=True)["returncode"] != 0
        assert run(client, "python -c 'import pyautogui; print(tuple(pyautogui.size()))'") == "(1280, 800)\n"
        assert (
            run(
                client, "command -v soffice && ls /usr/lib/libreoffice/program/ | grep -cx 'scalc\\|swriter\\|simpress'"
            )
            == "/usr/bin/soffice\n3\n"
        )

        assert client.step(A.Key(("ctrl", "alt", "t")), screenshot=False).ok
        run(
            client,
            "until xdotool search --onlyvisible --class gnome-terminal 2>/dev/null; do sleep 0.1; done",
            timeout=60,
        )
        tree = ET.fromstring(client.accessibility_tree())
        assert tree.tag == "desktop-frame"
        applications = list(tree)
        assert applications and all(node.tag == "application" for node in applications)
        terminal_app = next(a for a in applications if a.get("name") == "gnome-terminal-server")
        frame = terminal_app.find("frame")
        assert frame.get(f"{ST}showing") == frame.get(f"{ST}visible") == "true"
        assert re.fullmatch(r"\(-?\d+, -?\d+\)", frame.get(f"{CP}screencoord"))
        assert re.fullmatch(r"\(\d+, \d+\)", frame.get(f"{CP}size"))
        terminals = list(terminal_app.iter("terminal"))
        assert terminals and "user@" in (terminals[0].text or "")
    finally:
        pool.release(env)


@pytest.mark.docker
@pytest.mark.slow
def test_every_task_rewards_its_solution_and_not_a_wrong_one(pool):
    jobs = [
        (task_id, kind, texts)
        for task_id in TASKS
        for kind, texts in (("solution", SOLUTIONS[task_id]), ("wrong", WRONG_SOLUTIONS[task_id]))
    ]
    with concurrent.futures.ThreadPoolExecutor(pool.config.size) as executor:
        futures = {
            executor.submit(run_scripted, pool, TASKS[task_id], texts): (task_id, kind) for task_id, kind, texts in jobs
        }
        outcomes = {futures[f]: f.result().outcome for f in concurrent.futures.as_completed(futures)}
    wrong = {
        key: outcome
        for key, outcome in outcomes.items()
        if (outcome.status, outcome.reward)
        != ((EpisodeStatus.SUCCESS, 1.0) if key[1] == "solution" else (EpisodeStatus.FAILURE, 0.0))
    }
    assert not wrong, wrong
