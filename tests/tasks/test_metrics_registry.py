"""The metric registry: every OSWorld metric name known, arities consistent with the
functions, every implemented metric tested, and the schema and judges using the registry."""

import inspect
import pathlib
import re
import zipfile

import pytest
from docx import Document

from cua_jax.envs import actions as A
from cua_jax.tasks import judges
from cua_jax.tasks import metrics as M
from cua_jax.tasks.metrics.general import JUDGE_MARKER
from cua_jax.tasks.schema import METRICS as SCHEMA_METRICS
from cua_jax.tasks.schema import TaskSchemaError, parse_task

# Every metric name OSWorld's desktop_env/evaluators/metrics/__init__.py exports.
OSWORLD_METRICS = """
check_gnome_favorite_apps is_utc_0 check_text_enlarged check_moved_jpgs is_in_vm_clickboard
is_expected_tabs is_expected_bookmarks compare_pdfs compare_htmls compare_archive is_cookie_deleted
is_shortcut_on_desktop check_font_size check_enabled_experiments check_history_deleted
is_expected_search_query is_expected_active_tab is_expected_url_pattern_match is_added_to_steam_cart
is_expected_installed_extensions compare_pdf_images is_expected_active_tab_approximate
compare_font_names compare_subscript_contains has_page_numbers_in_footers compare_docx_lines
evaluate_colored_words_in_tables check_highlighted_words evaluate_strike_through_last_paragraph
evaluate_conversion evaluate_spacing check_italic_font_size_14 evaluate_alignment get_unique_train_ids
check_no_duplicates compare_init_lines find_default_font contains_page_break compare_docx_files
compare_docx_tables compare_line_spacing compare_insert_equation compare_highlighted_text
is_first_line_centered check_file_exists check_tabstops compare_contains_image
compare_docx_files_and_ignore_new_lines compare_docx_images compare_image_text compare_references
compare_unique_train_records check_csv check_accessibility_tree run_sqlite3 check_json check_list
exact_match match_in_list is_in_list fuzzy_match check_include_exclude check_direct_json_object
compare_time_in_speedtest_results is_included_all_json_objects is_gold_text_included_in_pdf
check_line_number file_contains compare_terminal_and_txt fuzzy_place_math compare_python_pure_text
diff_text_file literal_match check_structure_sim_resized check_structure_sim_with_threshold
check_brightness_decrease_and_structure_sim check_contrast_increase_and_structure_sim
check_saturation_increase_and_structure_sim check_image_size check_image_mirror
check_palette_and_structure_sim check_textbox_on_leftside check_green_background
check_file_exists_and_structure_sim check_triangle_position check_structure_sim check_config_status
compare_image_list increase_saturation decrease_brightness compare_triangle_positions check_sharper
check_image_file_size check_libre_locale compare_epub check_mp3_meta check_pdf_pages
check_presenter_console_disable check_image_stretch_and_center check_slide_numbers_color
compare_pptx_files check_strikethrough check_slide_orientation_Portrait
evaluate_presentation_fill_to_rgb_distance check_left_panel check_transition check_page_number_colors
check_auto_saving_time compare_table compare_csv compare_conference_city_in_order
check_thunderbird_prefs check_thunderbird_filter check_thunderbird_folder is_vlc_playing
is_vlc_recordings_folder is_vlc_fullscreen compare_images compare_audios compare_videos check_qt_bgcone
check_one_instance_when_started_from_file check_qt_minimal_view check_qt_max_volume
check_qt_slider_colours check_global_key_play_pause check_play_and_exit compare_text_file
compare_config compare_answer compare_result_files is_extension_installed check_json_settings
check_json_keybindings check_python_file_by_test_suite check_python_file_by_gold_file
check_html_background_image compare_zip_files infeasible
""".split()


def test_every_osworld_metric_is_implemented_or_listed_with_a_reason():
    assert len(OSWORLD_METRICS) == len(set(OSWORLD_METRICS)) == 139
    missing = [n for n in OSWORLD_METRICS if n not in M.METRICS and n not in M.KNOWN_UNIMPLEMENTED]
    assert missing == []
    assert not set(M.METRICS) & set(M.KNOWN_UNIMPLEMENTED)
    assert all(isinstance(reason, str) and len(reason) > 10 for reason in M.KNOWN_UNIMPLEMENTED.values())
    assert "python_judge" in M.METRICS and "" not in M.KNOWN_UNIMPLEMENTED


def test_every_implemented_metric_is_exercised_by_a_metric_test():
    sources = "\n".join(
        p.read_text()
        for p in pathlib.Path(__file__).parent.glob("test_metrics_*.py")
        if p.name != pathlib.Path(__file__).name
    )
    untested = [name for name in M.METRICS if not re.search(rf"\b{re.escape(name)}\(", sources)]
    assert untested == []


@pytest.mark.parametrize("name", sorted(M.METRICS))
def test_arity_fits_the_function_signature(name):
    entry = M.METRICS[name]
    params = list(inspect.signature(entry.fn).parameters.values())
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    takes_any = any(p.kind == p.VAR_POSITIONAL for p in params)
    assert takes_any or len(positional) >= entry.arity
    assert sum(1 for p in positional if p.default is p.empty) <= entry.required or takes_any
    for need in entry.needs:
        assert any(p.name == need or p.kind == p.VAR_KEYWORD for p in params)


def test_schema_table_follows_the_registry():
    assert SCHEMA_METRICS == {name: entry.arity for name, entry in M.METRICS.items()}
    assert (SCHEMA_METRICS["is_utc_0"], SCHEMA_METRICS["compare_table"], SCHEMA_METRICS["infeasible"]) == (1, 2, 0)
    assert M.METRICS["compare_table"].required == 1


def test_metric_entries_are_validated():
    with pytest.raises(ValueError, match="0, 1 or 2"):
        M.Metric(len, 3)
    with pytest.raises(ValueError, match="required"):
        M.Metric(len, 1, required=2)
    with pytest.raises(ValueError, match="unknown metric inputs"):
        M.Metric(len, 0, needs=("screen",))
    with pytest.raises(ValueError, match="already registered"):
        M.metric("exact_match")(lambda r, e: 1.0)


def test_lookup_explains_unusable_names():
    assert M.lookup("exact_match").fn is M.text.exact_match
    with pytest.raises(M.JudgeError, match="not implemented here: needs librosa"):
        M.lookup("compare_audios")
    with pytest.raises(M.JudgeError, match="unknown metric 'nope'"):
        M.lookup("nope")
    with pytest.raises(M.JudgeError, match="did you mean compare_pptx_files"):
        M.lookup("compare_pptx_file")
    with pytest.raises(M.JudgeError, match="draft task without an evaluator"):
        M.lookup("")
    assert M.is_judgeable("compare_pptx_files") and not M.is_judgeable("compare_videos")
    assert judges.JudgeError is M.JudgeError


# ---- the schema and the verdict through the registry ----------------------------------


def task(evaluator, tmp_path):
    return parse_task({"id": "m", "instruction": "x", "evaluator": evaluator}, tmp_path)


class FakeClient:
    def __init__(self, output="", judge_output=""):
        self.output, self.judge_output = output, judge_output

    def execute(self, command, shell=False, timeout=60.0):
        return {"output": self.output, "returncode": 0}

    def run_python(self, code, timeout):
        # the judge's verdict line carries the run's nonce: answer with the marker the code holds
        marker = re.search(re.escape(JUDGE_MARKER) + "[0-9a-f]+:", code)
        return {
            "output": self.judge_output.replace(JUDGE_MARKER, marker.group(0) if marker else JUDGE_MARKER),
            "error": "",
        }


def test_schema_checks_getters_against_arity(tmp_path):
    utc = {"func": "is_utc_0", "result": {"type": "vm_command_line", "command": "timedatectl"}}
    assert task(utc, tmp_path).evaluator.checks[0].expected is None
    with pytest.raises(TaskSchemaError, match="evaluator.expected: metric 'is_utc_0' takes no 'expected' getter"):
        task({**utc, "expected": {"type": "rule", "rules": {}}}, tmp_path)
    assert task({**utc, "expected": {}}, tmp_path)  # an empty getter object is none
    with pytest.raises(TaskSchemaError, match="metric 'compare_docx_files' needs a 'expected' getter"):
        task({"func": "compare_docx_files", "result": {"type": "local_file", "path": "a.docx"}}, tmp_path)
    sheet = task(
        {
            "func": "compare_table",
            "result": {"type": "local_file", "path": "a.xlsx"},
            "options": {"rules": [{"type": "check_cell"}]},
        },
        tmp_path,
    )
    assert sheet.evaluator.checks[0].expected is None
    audio = task(
        {
            "func": "compare_audios",
            "result": {"type": "local_file", "path": "a.mp3"},
            "expected": {"type": "local_file", "path": "b.mp3"},
        },
        tmp_path,
    )
    assert audio.evaluator.checks[0].func == "compare_audios"
    with pytest.raises(TaskSchemaError, match="unknown metric 'compare_smells'"):
        task({"func": "compare_smells"}, tmp_path)


def test_verdict_dispatches_through_the_registry(tmp_path):
    for name, text in (("a.docx", "Hello world"), ("b.docx", "Hello world"), ("c.docx", "Goodbye")):
        document = Document()
        document.add_paragraph(text)
        document.save(tmp_path / name)
    docs = {
        "func": "compare_docx_files",
        "result": {"type": "local_file", "path": "a.docx"},
        "expected": {"type": "local_file", "path": "b.docx"},
    }
    assert judges.evaluate(task(docs, tmp_path), FakeClient(), tmp_path / "cache", last_action=A.Done()) == 1.0
    wrong = {**docs, "expected": {"type": "local_file", "path": "c.docx"}, "options": {"ignore_case": True}}
    assert judges.evaluate(task(wrong, tmp_path), FakeClient(), tmp_path / "cache", last_action=A.Done()) == 0.0
    utc = task({"func": "is_utc_0", "result": {"type": "vm_command_line", "command": "timedatectl"}}, tmp_path)
    status = "a\nb\nc\n   Time zone: Etc/UTC (UTC, +0000)\n"
    assert judges.evaluate(utc, FakeClient(output=status), tmp_path / "cache", last_action=A.Done()) == 1.0
    judge = task({"func": "python_judge", "code": "def f():\n    return 1\n", "entry": "f"}, tmp_path)
    client = FakeClient(judge_output=f"{JUDGE_MARKER}0.5\n")
    assert judges.evaluate(judge, client, tmp_path / "cache", last_action=A.Done()) == 0.5


def test_verdict_errors_are_the_judges(tmp_path):
    audio = task(
        {
            "func": "compare_audios",
            "result": {"type": "local_file", "path": "a.txt"},
            "expected": {"type": "local_file", "path": "a.txt"},
        },
        tmp_path,
    )
    (tmp_path / "a.txt").write_text("x")
    with pytest.raises(judges.JudgeError, match="not implemented here"):
        judges.evaluate(audio, FakeClient(), tmp_path / "cache", last_action=A.Done())
    bad_option = task(
        {
            "func": "compare_text_file",
            "result": {"type": "local_file", "path": "a.txt"},
            "expected": {"type": "local_file", "path": "a.txt"},
            "options": {"ignore_everything": True},
        },
        tmp_path,
    )
    assert judges.evaluate(bad_option, FakeClient(), tmp_path / "cache", last_action=A.Done()) == 1.0  # **options
    literal = task(
        {
            "func": "literal_match",
            "result": {"type": "rule", "rules": {}},
            "expected": {"type": "rule", "rules": {}},
            "options": {"flavour": 1},
        },
        tmp_path,
    )
    with pytest.raises(judges.JudgeError, match="metric literal_match failed: TypeError") as caught:
        judges.evaluate(literal, FakeClient(), tmp_path / "cache", last_action=A.Done())
    assert isinstance(caught.value.__cause__, TypeError)
    # The message is what an episode's fault records: it carries the traceback.
    assert "Traceback (most recent call last)" in str(caught.value) and "in _score" in str(caught.value)
    sqlite = task(
        {
            "func": "run_sqlite3",
            "result": {"type": "local_file", "path": "db.sqlite"},
            "expected": {"type": "rule", "rules": {"sql": "select 7"}},
        },
        tmp_path,
    )
    import sqlite3

    sqlite3.connect(tmp_path / "db.sqlite").close()
    with pytest.raises(judges.JudgeError, match="gave 7.0, not a reward"):
        judges.evaluate(sqlite, FakeClient(), tmp_path / "cache", last_action=A.Done())


def test_a_malformed_result_scores_zero_and_a_reader_bug_raises(tmp_path):
    from cua_jax.tasks.metrics.base import load_result
    from cua_jax.tasks.metrics.documents import result_docx

    document = Document()
    document.add_paragraph("Hello")
    document.save(tmp_path / "e.docx")
    (tmp_path / "junk.docx").write_text("not a document")
    with zipfile.ZipFile(tmp_path / "partless.docx", "w") as archive:  # python-docx: a KeyError from zipfile
        archive.writestr("word/other.xml", "<x/>")
    for name in ("junk.docx", "partless.docx"):
        docs = {
            "func": "compare_docx_files",
            "result": {"type": "local_file", "path": name},
            "expected": {"type": "local_file", "path": "e.docx"},
        }
        assert judges.evaluate(task(docs, tmp_path), FakeClient(), tmp_path / "cache", last_action=A.Done()) == 0.0
        assert result_docx(str(tmp_path / name)) is None
    assert result_docx(str(tmp_path / "absent.docx")) is None

    def reader_with_a_bug(path):
        return result_docx(path).paragraphs[0].text.upper(1)  # a TypeError of this reader's own

    with pytest.raises(TypeError):
        load_result(reader_with_a_bug, str(tmp_path / "e.docx"), "docx")
    with pytest.raises(ValueError, match="no parse errors known for file format 'doc'"):
        load_result(result_docx, str(tmp_path / "e.docx"), "doc")
