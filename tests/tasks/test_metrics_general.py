"""The os / multi_apps metrics, archives and HTML, and the application-file metrics."""

import datetime
import io
import re
import tarfile
import zipfile
from types import SimpleNamespace

import pytest

from cua_jax.envs import actions as A
from cua_jax.envs.container_judge import JudgeTamperedError
from cua_jax.tasks.metrics import JudgeError
from cua_jax.tasks.metrics import apps as Ap
from cua_jax.tasks.metrics import general as G


def write(path, content):
    path.write_text(content)
    return str(path)


# ---- command output and desktop state -----------------------------------------------


def test_gnome_favourites_timezone_scaling():
    rules = {"expected": ["thunderbird.desktop", "vim.desktop"]}
    assert G.check_gnome_favorite_apps("['vim.desktop', 'thunderbird.desktop']\n", rules) == 1.0
    assert G.check_gnome_favorite_apps("['vim.desktop']", rules) == 0.0
    assert G.check_gnome_favorite_apps("__import__('os')", rules) == 0.0  # never evaluated
    status = (
        "               Local time: Thu 2024-01-25 12:56:06 WET\n"
        "           Universal time: Thu 2024-01-25 12:56:06 UTC\n"
        "                 RTC time: Thu 2024-01-25 12:56:05\n"
        "                Time zone: {zone}\n"
    )
    assert G.is_utc_0(status.format(zone="Atlantic/Faroe (WET, +0000)")) == 1.0
    assert G.is_utc_0(status.format(zone="Europe/Paris (CET, +0100)")) == 0.0
    assert G.check_text_enlarged("1.25\n") == 1.0
    assert G.check_text_enlarged("1.0") == 0.0


def test_moved_files_clipboard_config(tmp_path):
    tree = {"type": "directory", "name": "cpjpg", "children": [{"name": "a.jpg"}, {"name": "b.jpg"}]}
    assert G.check_moved_jpgs(tree, {"expected": ["b.jpg", "a.jpg"]}) == 1.0
    assert G.check_moved_jpgs(tree, {"expected": ["a.jpg"]}) == 0.0
    assert G.is_in_vm_clickboard({"expected": ["alpha", "beta"]}, "alpha and beta") == 1.0
    assert G.is_in_vm_clickboard({"expected": "gamma"}, "alpha and beta") == 0.0
    gimprc = write(tmp_path / "gimprc", '# GIMP gimprc\n(theme "Light")\n(default-image (width 800))\n')
    assert G.check_config_status(gimprc, {"key": "theme", "value": '"Light"'}) == 1.0
    assert G.check_config_status(gimprc, {"key": "theme", "value": '"Dark"'}) == 0.0
    assert G.check_config_status(gimprc, {"key": ["default-image", "(width"], "value": "800"}) == 1.0  # ")"s stripped
    assert G.check_config_status(gimprc, {"key": ["default-image", "(width"], "value": "600"}) == 0.0
    assert G.check_file_exists(str(tmp_path), "gimprc") == 1.0
    assert G.check_file_exists(str(tmp_path), "nope") == 0.0


A11Y = (
    '<desktop-frame xmlns:st="https://accessibility.ubuntu.example.org/ns/state" '
    'xmlns:attr="https://accessibility.ubuntu.example.org/ns/attributes">'
    '<application name="Files"><label name="Status" attr:id="status" st:showing="true">Saved</label>'
    "</application></desktop-frame>"
)


def test_check_accessibility_tree():
    assert (
        G.check_accessibility_tree(A11Y, [{"xpath": "//label[@attr:id='status']", "text": "Saved", "exact": True}])
        == 1.0
    )
    assert G.check_accessibility_tree(A11Y, [{"xpath": "//label", "text": "Unsaved", "exact": True}]) == 0.0
    assert 0.0 < G.check_accessibility_tree(A11Y, [{"xpath": "//label", "text": "Save", "exact": False}]) < 1.0
    assert G.check_accessibility_tree(A11Y, [{"xpath": "//button"}]) == 0.0
    # OSWorld's CSS selector rules, namespaced attributes as attr|name
    selected = [{"selectors": ["application[name=Files] > label[attr|id=status]"], "text": "Saved", "exact": True}]
    assert G.check_accessibility_tree(A11Y, selected) == 1.0
    assert G.check_accessibility_tree(A11Y, [{"selectors": ["application[name=Mail] label"]}]) == 0.0
    assert G.check_accessibility_tree("<not xml", [{"xpath": "//x"}]) == 0.0
    with pytest.raises(JudgeError, match="'xpath' or 'selectors'"):
        G.check_accessibility_tree(A11Y, [{"text": "x"}])
    with pytest.raises(JudgeError, match="osname"):
        G.check_accessibility_tree(A11Y, [], osname="plan9")


def test_compare_time_in_speedtest_results(tmp_path, monkeypatch):
    monkeypatch.setattr(G, "_clock", lambda: datetime.datetime(2024, 5, 1, 10, 30))
    path = write(tmp_path / "speed.csv", "Server,Timestamp\nX,2024-05-01 10:27\n")
    assert G.compare_time_in_speedtest_results(path, "5") == 1.0
    assert G.compare_time_in_speedtest_results(path, 2) == 0.0
    assert G.compare_time_in_speedtest_results(write(tmp_path / "bad.csv", "only header\n"), 5) == 0.0


# ---- archives and HTML ---------------------------------------------------------------


def archive(path, members, kind="zip"):
    if kind == "zip":
        with zipfile.ZipFile(path, "w") as out:
            for name, data in members.items():
                out.writestr(name, data)
    else:
        with tarfile.open(path, "w:gz") as out:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(data.encode())
                out.addfile(info, io.BytesIO(data.encode()))
    return str(path)


def test_compare_archive(tmp_path):
    gold = archive(tmp_path / "gold.zip", {"notes/a.txt": "alpha", "notes/b.txt": "beta"})
    same = archive(tmp_path / "same.tar.gz", {"notes/a.txt": "alpha", "notes/b.txt": "beta"}, kind="tar")
    assert G.compare_archive(same, gold, file_path="notes", file_type="text") == 1.0
    half = archive(tmp_path / "half.zip", {"notes/a.txt": "alpha", "notes/b.txt": "BETA"})
    assert G.compare_archive(half, gold, file_path="notes") == 0.5
    assert G.compare_archive(half, gold, file_path="notes", ignore_case=True) == 1.0  # options pass through
    renamed = archive(tmp_path / "renamed.zip", {"notes/a.txt": "alpha", "notes/c.txt": "beta"})
    assert G.compare_archive(renamed, gold, file_path="notes") == 0.0
    escaping = archive(tmp_path / "evil.zip", {"../outside.txt": "x"})
    assert G.compare_archive(escaping, gold, file_path="notes") == 0.0
    assert not (tmp_path.parent / "outside.txt").exists()
    with pytest.raises(JudgeError, match="not 'audio'"):
        G.compare_archive(same, gold, file_type="audio")


def test_compare_htmls(tmp_path):
    expected = write(
        tmp_path / "e.html", '<html><body><table><tr><td sdnum="1;0;@">Total</td></tr></table></body></html>'
    )
    assert (
        G.compare_htmls(
            write(
                tmp_path / "r.html", '<html><body><table><tr><td sdnum="1;0;@">Total</td></tr></table></body></html>'
            ),
            expected,
        )
        == 1.0
    )
    other_number = write(
        tmp_path / "s.html", '<html><body><table><tr><td sdnum="1;0;0.00">Total</td></tr></table></body></html>'
    )
    assert G.compare_htmls(other_number, expected) == 0.0
    assert G.compare_htmls(other_number, expected, ignore_sdnum=True) == 1.0
    assert G.compare_htmls(write(tmp_path / "w.html", "<html><body><p>Total</p></body></html>"), expected) == 0.0


def test_check_html_background_image(tmp_path):
    page = write(
        tmp_path / "p.html", "<html><head><style>body { background-image: url('bg.png'); }</style></head></html>"
    )
    assert G.check_html_background_image(page, {"value": "bg.png"}) == 1.0
    assert G.check_html_background_image(page, {"value": "other.png"}) == 0.0


# ---- the last action and the environment's judge -------------------------------------


def test_infeasible():
    assert G.infeasible(last_action=A.Fail()) == 1.0
    assert G.infeasible(last_action=A.Done()) == 0.0


class FakeJudge:
    """Answers with `output`, each JUDGE_MARKER in it replaced by the run's own marker (with
    its nonce) when `knows_nonce`, as the judge code would print it."""

    def __init__(self, output, knows_nonce=True, returncode=0):
        self.output, self.knows_nonce, self.returncode, self.code = output, knows_nonce, returncode, None

    def run_python(self, code, timeout):
        self.code = code
        marker = re.search(re.escape(G.JUDGE_MARKER) + "[0-9a-f]{32}:", code).group(0)
        output = self.output.replace(G.JUDGE_MARKER, marker) if self.knows_nonce else self.output
        return {"output": output, "error": "boom", "returncode": self.returncode}


def test_python_judge_runs_in_the_environment():
    evaluator = SimpleNamespace(code="def check():\n    return 1\n", entry="check", timeout=5.0)
    judge = FakeJudge(f"noise\n{G.JUDGE_MARKER}0.75\n")
    assert G.python_judge(judge=judge, evaluator=evaluator) == 0.75
    assert "def check():" in judge.code and "_value = check()" in judge.code
    with pytest.raises(JudgeError, match="not a reward"):
        G.python_judge(judge=FakeJudge(f"{G.JUDGE_MARKER}7\n"), evaluator=evaluator)
    with pytest.raises(JudgeError, match="no result .*boom"):
        G.python_judge(judge=FakeJudge(""), evaluator=evaluator)


def test_python_judge_takes_only_its_own_verdict():
    """A verdict line without this run's nonce is not the judge's; a second one is tampering;
    a judge that did not exit cleanly gave no verdict, whatever it printed."""
    evaluator = SimpleNamespace(code="def check():\n    return 0\n", entry="check", timeout=5.0)
    with pytest.raises(JudgeError, match="no result"):  # an old-style or guessed marker
        G.python_judge(judge=FakeJudge(f"{G.JUDGE_MARKER}1.0\n", knows_nonce=False), evaluator=evaluator)
    with pytest.raises(JudgeTamperedError, match="2 verdicts"):
        G.python_judge(judge=FakeJudge(f"{G.JUDGE_MARKER}1.0\n{G.JUDGE_MARKER}0.0\n"), evaluator=evaluator)
    with pytest.raises(JudgeError, match="exit -9"):
        G.python_judge(judge=FakeJudge(f"{G.JUDGE_MARKER}1.0\n", returncode=-9), evaluator=evaluator)


# ---- VLC, LibreOffice, Thunderbird files ---------------------------------------------

VLCRC = """# Show background cone (boolean)
#qt-bgcone=1
qt-bgcone=0
# Maximum volume (integer)
qt-max-volume=200
#qt-minimal-view=0
one-instance-when-started-from-file=0
play-and-exit=1
global-key-play-pause=Space
qt-slider-colours=0;0;0;20;20;20;50;50;50;10;10;10
input-record-path=/home/user/Desktop
"""


def test_vlc_settings(tmp_path):
    rc = write(tmp_path / "vlcrc", VLCRC)
    assert Ap.check_qt_bgcone(rc, {"expected_qt_bgcone": 0}) == 1.0
    assert Ap.check_qt_bgcone(rc, {"expected_qt_bgcone": 1}) == 0.0
    assert Ap.check_qt_max_volume(rc, {"expected_qt_max_volume": "200"}) == 1.0
    assert Ap.check_qt_max_volume(rc, {"expected_qt_max_volume": 125}) == 0.0
    assert Ap.check_qt_minimal_view(rc, {"expected_qt_minimal_view": 0}) == 1.0
    assert Ap.check_qt_minimal_view(rc, {"expected_qt_minimal_view": 1}) == 0.0
    assert Ap.check_one_instance_when_started_from_file(rc, {"expected_one_instance_when_started_from_file": 0}) == 1.0
    assert Ap.check_one_instance_when_started_from_file(rc, {"expected_one_instance_when_started_from_file": 1}) == 0.0
    assert Ap.check_play_and_exit(rc, {"expected_play_and_exit": 1}) == 1.0
    assert Ap.check_play_and_exit(write(tmp_path / "empty", ""), {"expected_play_and_exit": 1}) == 0.0
    assert Ap.check_global_key_play_pause(rc, {"expected_global_key_play_pause": 1}) == 1.0
    assert Ap.check_global_key_play_pause(rc, {"expected_global_key_play_pause": 0}) == 0.0
    assert Ap.check_qt_slider_colours(rc, {"type": "blackish"}) == 1.0
    assert Ap.check_qt_slider_colours(write(tmp_path / "rc2", ""), {"type": "blackish"}) == 0.0  # VLC's default
    assert Ap.check_qt_slider_colours(rc, {"type": "match", "expected_qt_slider_colours": "0;0;0"}) == 0.0
    assert Ap.is_vlc_recordings_folder(rc, {"recording_file_path": "/home/user/Desktop"}) == 1.0
    assert Ap.is_vlc_recordings_folder(rc, {"recording_file_path": "/tmp"}) == 0.0


def test_vlc_status_and_fullscreen(tmp_path):
    status = write(
        tmp_path / "status.xml",
        '<root><state>playing</state><information><category name="meta">'
        '<info name="filename">/home/user/Music/song.mp3</info></category>'
        "</information></root>",
    )
    assert Ap.is_vlc_playing(status, {"type": "file_name", "file_name": "song.mp3"}) == 1.0
    assert Ap.is_vlc_playing(status, {"type": "file_name", "file_name": "other.mp3"}) == 0.0
    stream = write(
        tmp_path / "s.xml",
        '<root><state>playing</state><information><category name="meta">'
        '<info name="url">http://radio.example/live/stream.m3u8?x=1</info>'
        "</category></information></root>",
    )
    assert Ap.is_vlc_playing(stream, {"type": "url", "url": "http://radio.example/live/stream.m3u8"}) == 1.0
    paused = write(tmp_path / "p.xml", "<root><state>paused</state></root>")
    assert Ap.is_vlc_playing(paused, {"type": "file_name", "file_name": "song.mp3"}) == 0.0
    assert Ap.is_vlc_fullscreen({"width": 1920, "height": 1080}, {"width": 1920, "height": 1080}) == 1.0
    assert Ap.is_vlc_fullscreen({"width": 800, "height": 600}, {"width": 1920, "height": 1080}) == 0.0


def test_libre_locale(tmp_path):
    xcu = write(
        tmp_path / "r.xcu",
        '<?xml version="1.0"?><oor:items xmlns:oor="http://openoffice.org/2001/registry">'
        '<item oor:path="/org.openoffice.Setup/L10N"><prop oor:name="ooSetupSystemLocale" '
        'oor:op="fuse"><value>de-DE</value></prop></item></oor:items>',
    )
    assert Ap.check_libre_locale(xcu, {"locale_set": ["de-*", "fr-FR"]}) == 1.0
    assert Ap.check_libre_locale(xcu, {"locale_set": ["en-*"]}) == 0.0


PREFS = """// Mozilla User Preferences
user_pref("mail.spellcheck.inline", false);
user_pref("mailnews.default_sort_order", 2);
user_pref("mail.identity.id1.fullName", "Ann \\"A\\" Lee");
"""


def test_thunderbird_prefs(tmp_path):
    prefs = write(tmp_path / "prefs.js", PREFS)
    rules = {
        "expect": {
            "mail.spellcheck.inline": {"method": "eq", "ref": False},
            "mailnews.default_sort_order": {"method": "ge", "ref": 2},
        },
        "unexpect": {"mail.identity.id1.fullName": {"method": "re", "ref": "^Bob"}},
    }
    assert Ap.check_thunderbird_prefs(prefs, rules) == 1.0
    assert Ap.check_thunderbird_prefs(prefs, {"expect": {"mail.never.set": {"method": "eq", "ref": 1}}}) == 0.0
    assert (
        Ap.check_thunderbird_prefs(prefs, {"unexpect": {"mail.identity.id1.fullName": {"method": "re", "ref": "Ann"}}})
        == 0.0
    )


FILTERS = """version="9"
logging="no"
name="Forward all"
enabled="yes"
type="17"
action="Forward"
actionValue="anon@example.com"
condition="ALL"
name="Spam"
enabled="no"
type="17"
action="Move to folder"
actionValue="mailbox://nobody@Local%20Folders/Junk"
condition="AND (subject,contains,offer) OR (from,is,\\"x@y\\")"
"""


def test_thunderbird_filters(tmp_path):
    path = write(tmp_path / "msgFilterRules.dat", FILTERS)
    found = Ap.thunderbird_filters(FILTERS)
    assert found[1]["condition"] == ["AND (subject,contains,offer)", 'OR (from,is,"x@y")']
    assert (
        Ap.check_thunderbird_filter(path, {"expect": [{"enabled": "yes", "action": "Forward", "condition": ["ALL"]}]})
        == 1.0
    )
    assert Ap.check_thunderbird_filter(path, {"expect": [{"name": "Missing"}]}) == 0.0
    assert Ap.check_thunderbird_filter(path, {"unexpect": [{"name": "Spam"}]}) == 0.0


# ---- Chrome's state, as OSWorld's Chrome getters return it ---------------------------

from cua_jax.tasks.metrics import browser as B  # noqa: E402


def test_active_tab_and_url_patterns():
    tab = {"url": "https://www.example.com/search?q=cats&page=2", "title": "Search"}
    assert B.is_expected_active_tab_approximate(tab, {"type": "url", "url": "https://www.example.com/search"}) == 1.0
    assert B.is_expected_active_tab_approximate(tab, {"type": "url", "url": "https://www.example.com/find"}) == 0.0
    assert B.is_expected_url_pattern_match(tab, {"expected": [r"q=cats", r"page=\d"]}) == 1.0
    assert B.is_expected_url_pattern_match(tab["url"], {"expected": [r"q=dogs"]}) == 0.0
    assert B.is_expected_search_query(tab, {"expect": {"pattern": "q=cats"}}) == 1.0
    assert B.is_expected_search_query(tab, {"expect": {"pattern": "q=dogs"}}) == 0.0
    assert B.is_added_to_steam_cart({"content": "Cart: Portal 2, Celeste"}, {"items": ["Portal 2", "Celeste"]}) == 1.0
    assert B.is_added_to_steam_cart({"content": "Cart: Portal 2"}, {"items": ["Portal 2", "Celeste"]}) == 0.0
    with pytest.raises(JudgeError, match="rule type 'title'"):
        B.is_expected_active_tab_approximate(tab, {"type": "title", "url": "x"})


def test_extensions_bookmarks_history_flags_fonts():
    assert (
        B.is_expected_installed_extensions(
            ["Zoom for Google Chrome", "uBlock"], {"expected": ["Zoom Chrome Extension"]}
        )
        == 1.0
    )
    assert B.is_expected_installed_extensions(["uBlock"], {"expected": ["Grammarly"]}) == 0.0
    bookmarks = {
        "bookmark_bar": {
            "children": [
                {
                    "type": "folder",
                    "name": "Liked Authors",
                    "children": [
                        {"type": "url", "url": "https://a.example"},
                        {"type": "url", "url": "https://b2.example"},
                    ],
                },
                {"type": "url", "url": "https://news.example", "name": "News"},
            ]
        }
    }
    assert B.is_expected_bookmarks(bookmarks, {"type": "bookmark_bar_folders_names", "names": ["Liked Authors"]}) == 1.0
    assert (
        B.is_expected_bookmarks(bookmarks, {"type": "bookmark_bar_websites_urls", "urls": ["https://x.example"]}) == 0.0
    )
    liked = {
        "type": "liked_authors_websites_urls",
        "urls": ["https://a.example", ["https://b1.example", "https://b2.example"]],
    }
    assert B.is_expected_bookmarks(bookmarks, liked) == 1.0
    assert B.is_expected_bookmarks(bookmarks, {**liked, "urls": ["https://a.example"]}) == 0.0
    history = [("https://mail.example/inbox", "Inbox", 3)]
    assert B.check_history_deleted(history, {"type": "keywords", "keywords": ["news"]}) == 1.0
    assert B.check_history_deleted(history, {"type": "keywords", "keywords": ["mail"]}) == 0.0
    assert B.check_enabled_experiments(["smooth-scrolling@1"], {"type": "names", "names": ["smooth-scrolling"]}) == 1.0
    assert B.check_enabled_experiments([], {"type": "names", "names": ["smooth-scrolling"]}) == 0.0
    assert B.check_font_size({"default_font_size": 20}, {"type": "range", "min": 16, "max": 24}) == 1.0
    assert B.check_font_size({"default_font_size": 20}, {"type": "value", "value": 16}) == 0.0


def test_is_shortcut_on_desktop():
    shortcuts = {
        "/home/user/Desktop/site.desktop": "[Desktop Entry]\nName=Example Docs\nExec=chrome --app=https://docs.example\n"
    }
    assert B.is_shortcut_on_desktop(shortcuts, {"type": "name", "name": "example docs"}) == 1.0
    assert B.is_shortcut_on_desktop(shortcuts, {"type": "name", "name": "Mail"}) == 0.0
    assert B.is_shortcut_on_desktop(shortcuts, {"type": "exec", "exec": "--app=https://docs.example"}) == 1.0
    assert B.is_shortcut_on_desktop(shortcuts, {"type": "exec", "exec": "firefox"}) == 0.0
