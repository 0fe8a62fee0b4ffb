"""The oracle's pure parts: where its clicks land, and how it reads a DOM (no browser)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cua_jax.envs import actions as A
from cua_jax.envs.miniwob import TASK_HEIGHT, TASK_WIDTH, DomElement, MiniWoBObservation, dom_from_text, dom_to_text
from cua_jax.envs.miniwob_oracle import OracleError, click_element, oracle_action


def _element(ref, tag, left, top, width, height, parent=None, depth=0, **kw):
    return DomElement(ref, parent, depth, tag, kw.pop("text", ""), left, top, width, height, **kw)


def _obs(task, utterance, dom):
    return MiniWoBObservation(task, utterance, np.zeros((TASK_HEIGHT, TASK_WIDTH, 3), np.uint8), tuple(dom))


@settings(max_examples=300, deadline=None)
@given(
    left=st.floats(-50, TASK_WIDTH - 1),
    top=st.floats(-50, TASK_HEIGHT - 1),
    width=st.floats(1, 200),
    height=st.floats(1, 200),
)
def test_clicks_land_inside_the_visible_part_of_the_element(left, top, width, height):
    element = _element(1, "BUTTON", left, top, width, height)
    visible_right, visible_bottom = min(TASK_WIDTH, left + width), min(TASK_HEIGHT, top + height)
    if visible_right - max(0, left) < 1 or visible_bottom - max(0, top) < 1:
        return  # less than a pixel on screen
    click = click_element(element, TASK_WIDTH, TASK_HEIGHT)
    px, py = A.grid_to_pixels(click.x, click.y, TASK_WIDTH, TASK_HEIGHT)
    assert max(0, left) - 1 <= px <= visible_right and max(0, top) - 1 <= py <= visible_bottom
    assert A.parse_action(A.render_action(click)) == click


def test_element_outside_the_task_region_is_an_oracle_error():
    with pytest.raises(OracleError, match="outside"):
        click_element(_element(1, "BUTTON", 300, 20, 30, 20), TASK_WIDTH, TASK_HEIGHT)


def test_checkbox_oracle_toggles_mismatches_then_submits():
    dom = [
        _element(1, "LABEL", 2, 59, 47, 11),
        _element(2, "INPUT_checkbox", 6, 55, 20, 13, parent=1, value=False),
        _element(-1, "t", 29, 59, 20, 11, parent=1, text="USa"),
        _element(3, "LABEL", 2, 78, 62, 11),
        _element(4, "INPUT_checkbox", 6, 74, 20, 13, parent=3, value=True),
        _element(-2, "t", 29, 78, 35, 11, parent=3, text="DKkQH"),
        _element(5, "BUTTON", 2, 101, 101, 31, text="Submit", id="subbtn"),
    ]
    first = oracle_action(_obs("click-checkboxes", "Select USa and click Submit.", dom))
    assert A.grid_to_pixels(first.x, first.y, TASK_WIDTH, TASK_HEIGHT)[1] in range(55, 68)  # USa's box
    dom[1] = dataclasses.replace(dom[1], value=True)
    second = oracle_action(_obs("click-checkboxes", "Select USa and click Submit.", dom))
    assert A.grid_to_pixels(second.x, second.y, TASK_WIDTH, TASK_HEIGHT)[1] in range(74, 87)  # untick DKkQH
    dom[4] = dataclasses.replace(dom[4], value=False)
    third = oracle_action(_obs("click-checkboxes", "Select USa and click Submit.", dom))
    assert A.grid_to_pixels(third.x, third.y, TASK_WIDTH, TASK_HEIGHT)[1] in range(101, 132)  # Submit
    assert "INPUT_checkbox#" not in dom_to_text(tuple(dom)) and "[5] BUTTON#subbtn 'Submit'" in dom_to_text(tuple(dom))


def test_enter_text_oracle_focuses_types_and_submits():
    field = _element(1, "INPUT_text", 5, 56, 128, 21, id="tt", value="")
    submit = _element(2, "BUTTON", 5, 87, 101, 31, text="Submit", id="subbtn")
    utterance = 'Enter "Jerald" into the text field and press Submit.'
    assert isinstance(oracle_action(_obs("enter-text", utterance, [field, submit])), A.Click)
    focused = dataclasses.replace(field, focused=True)
    assert oracle_action(_obs("enter-text", utterance, [focused, submit])) == A.Type("Jerald")
    wrong = dataclasses.replace(focused, value="Jer4")
    assert oracle_action(_obs("enter-text", utterance, [wrong, submit])) == A.Key(("backspace",))
    done = dataclasses.replace(focused, value="Jerald")
    click = oracle_action(_obs("enter-text", utterance, [done, submit]))
    assert A.grid_to_pixels(click.x, click.y, TASK_WIDTH, TASK_HEIGHT)[1] in range(87, 118)


def test_missing_target_names_what_was_looked_for():
    with pytest.raises(OracleError, match="button 'ok'"):
        oracle_action(
            _obs("click-button", 'Click on the "ok" button.', [_element(1, "BUTTON", 2, 52, 33, 21, text="no")])
        )


# ---- action spaces and the scripts of the further tasks (pages as DOM text) ---------------


def _page(task, utterance, dom_text, action_space="coordinates"):
    """An observation of `dom_text` as the oracle reads it in `action_space` (no geometry for elements)."""
    dom = dom_from_text(dom_text)
    if action_space == "elements":
        dom = dom_from_text(dom_to_text(dom, geometry=False))
    return _obs(task, utterance, dom)


def _pixel(action):
    return A.grid_to_pixels(action.x, action.y, TASK_WIDTH, TASK_HEIGHT)


CHECKBOXES = """[1] BODY @0,0 500x210
  [2] DIV#area @0,50 160x103
    [3] LABEL @2,59 60x11
      [4] INPUT_checkbox#ch0 value=False @6,55 20x13
      [-1] t 'U6gHF' @29,59 33x11
    [5] LABEL @2,78 71x11
      [6] INPUT_checkbox#ch1 value=True @6,74 20x13
      [-2] t 'pKybC69' @29,78 44x11
    [7] BUTTON#subbtn.secondary-action 'Submit' @2,120 101x31"""


@pytest.mark.parametrize("action_space", ["elements", "both"])
def test_element_spaces_act_by_ref(action_space):
    utterance = "Select U6gHF and click Submit."
    obs = _page("click-checkboxes-transfer", utterance, CHECKBOXES, "elements")
    assert all(np.isnan(e.left) for e in obs.dom)  # no geometry to lean on
    assert oracle_action(obs, action_space) == A.ClickElement(4)
    ticked = CHECKBOXES.replace("value=False", "value=True").replace("ch1 value=True", "ch1 value=False")
    assert oracle_action(
        _page("click-checkboxes-transfer", utterance, ticked, "elements"), action_space
    ) == A.ClickElement(7)
    assert isinstance(oracle_action(_page("click-checkboxes-transfer", utterance, CHECKBOXES)), A.Click)


def test_unknown_action_space_is_refused():
    with pytest.raises(ValueError, match="action space"):
        oracle_action(_page("click-checkboxes", "Select U6gHF and click Submit.", CHECKBOXES), "pixels")


LOGIN = """[1] BODY @0,0 500x210
  [2] DIV#form @2,62 156x135
    [3] LABEL.bold 'Username' @2,62 57x11
    [4] INPUT_text#username{user} @7,78 128x21
    [5] LABEL.bold 'Password' @2,114 54x11
    [6] INPUT_password#password{password} @7,130 108x21
    [7] BUTTON#subbtn.secondary-action 'Login' @2,166 90x31"""
LOGIN_UTTERANCE = 'Enter the username "karrie" and the password "AU" into the text fields and press login.'


def test_login_fills_fields_in_turn_then_submits():
    fresh = LOGIN.format(user="", password="")
    assert oracle_action(_page("login-user", LOGIN_UTTERANCE, fresh, "elements"), "elements") == A.FillElement(
        4, "karrie"
    )
    assert _pixel(oracle_action(_page("login-user", LOGIN_UTTERANCE, fresh)))[1] in range(78, 99)  # focus the username
    typing = LOGIN.format(user=" focused", password="")
    assert oracle_action(_page("login-user", LOGIN_UTTERANCE, typing)) == A.Type("karrie")
    half = LOGIN.format(user=" value='kar' focused", password="")
    assert oracle_action(_page("login-user", LOGIN_UTTERANCE, half)) == A.Type("rie")
    user_done = LOGIN.format(user=" value='karrie'", password="")
    assert oracle_action(_page("login-user", LOGIN_UTTERANCE, user_done, "elements"), "elements") == A.FillElement(
        6, "AU"
    )
    done = LOGIN.format(user=" value='karrie'", password=" value='AU'")
    assert oracle_action(_page("login-user", LOGIN_UTTERANCE, done, "elements"), "elements") == A.ClickElement(7)
    assert _pixel(oracle_action(_page("login-user", LOGIN_UTTERANCE, done)))[1] in range(166, 197)


BUTTONS = """[1] BODY @0,0 500x210
  [2] DIV#area @0,50 160x4
    [3] BUTTON#subbtn 'ONE'{one_focus} @40,80 40x40
    [4] BUTTON#subbtn2 'TWO' @50,90 40x40"""


def test_covered_button_is_clicked_where_it_shows():
    obs = _page("click-test-2", "Click button ONE.", BUTTONS.format(one_focus=""))
    px, py = _pixel(oracle_action(obs))
    assert 40 <= px < 80 and 80 <= py < 120 and not (50 <= px < 90 and 90 <= py < 130)  # on ONE, off TWO


def test_button_sequence_reads_progress_from_focus():
    first = oracle_action(
        _page(
            "click-button-sequence",
            "Click button ONE, then click button TWO.",
            BUTTONS.format(one_focus=""),
            "elements",
        ),
        "elements",
    )
    second = oracle_action(
        _page(
            "click-button-sequence",
            "Click button ONE, then click button TWO.",
            BUTTONS.format(one_focus=" focused"),
            "elements",
        ),
        "elements",
    )
    assert (first, second) == (A.ClickElement(3), A.ClickElement(4))


ACCORDION = """[1] BODY @0,0 500x210
  [2] DIV#area.ui-accordion @0,50 160x137
    [3] H3#ui-id-1.ui-accordion-header{first} @4,54 152x18
      [-1] t 'Section #1' @6,56 64x14
    [4] DIV#ui-id-2.ui-accordion-content.ui-accordion-content-active @4,74 152x{height}
      [5] SPAN.alink 'blandit' @6,108 35x11
      [6] SPAN.alink 'Congue.' @79,120 41x11
    [7] H3#ui-id-3.ui-accordion-header{second} @4,145 152x18
      [-2] t 'Section #2' @6,147 64x14"""
ACCORDION_UTTERANCE = 'Expand the sections below, to find and click on the link "{}".'


@pytest.mark.parametrize("action_space", ["coordinates", "elements"])
def test_accordion_waits_for_slides_then_clicks_the_link_or_the_next_section(action_space):
    def act(link, height=69, first=".ui-accordion-header-active", second=".ui-accordion-header-collapsed"):
        dom = ACCORDION.format(first=first, second=second, height=height)
        return oracle_action(
            _page("click-collapsible-2", ACCORDION_UTTERANCE.format(link), dom, action_space), action_space
        )

    link = act("Congue.")
    assert link == A.ClickElement(6) if action_space == "elements" else _pixel(link)[1] in range(120, 131)
    next_section = act("aliquet")
    assert (
        next_section == A.ClickElement(7) if action_space == "elements" else _pixel(next_section)[1] in range(145, 163)
    )
    # Just clicked: the classes moved to section 2, its section not shown yet.
    assert act("aliquet", first=".ui-accordion-header-collapsed", second=".ui-accordion-header-active") == A.Wait(0.5)
    if action_space == "coordinates":  # sliding open: the section cuts off its second line
        assert act("Congue.", height=40) == A.Wait(0.5)


MOVIES = """[1] BODY @0,0 500x210
  [2] DIV#area @0,50 160x134
    [3] DIV.ui-entry-wrap @10,53 140x120
      [4] DIV.ui-entry @15,61 130x30
        [5] INPUT_text @15,61 124x15
        [6] DIV.ui-label 'Director' @15,76 130x11
      [7] DIV.ui-entry @15,99 130x30
        [8] INPUT_text{year} @15,99 124x15
        [9] DIV.ui-label 'Year' @15,114 130x11
      [10] DIV.ui-entry @15,137 130x30
        [11] INPUT_text @15,137 124x15
        [12] DIV.ui-label 'Genre' @15,152 130x11
    [13] DIV.ui-footer @0,175 160x25
      [14] DIV.ui-submit 'Search' @53,177 54x20"""


def test_movie_search_reads_labels_beside_fields():
    utterance = "Search for action movies directed by Bowen from year 1998."
    assert oracle_action(
        _page("multi-layouts", utterance, MOVIES.format(year=""), "elements"), "elements"
    ) == A.FillElement(5, "Bowen")
    filled = (
        MOVIES.format(year=" value='1998'")
        .replace("[5] INPUT_text", "[5] INPUT_text value='Bowen'")
        .replace("[11] INPUT_text", "[11] INPUT_text value='action'")
    )
    assert oracle_action(_page("multi-layouts", utterance, filled, "elements"), "elements") == A.ClickElement(14)
    partly = MOVIES.format(year=" value='1998'").replace("[5] INPUT_text", "[5] INPUT_text value='Bowen'")
    assert oracle_action(_page("multi-layouts", utterance, partly, "elements"), "elements") == A.FillElement(
        11, "action"
    )


AUTOCOMPLETE = """[1] BODY @0,0 500x210
  [2] DIV#area @0,50 160x88
    [3] LABEL 'Tags:' @10,60 26x11
    [4] INPUT_text#tags.ui-autocomplete-input{field} @10,71 128x21
    [5] BUTTON#subbtn.secondary-action 'Submit' @10,97 101x31{menu}"""
MENU = """
  [6] UL#ui-id-1.ui-menu.ui-widget.ui-autocomplete @10,92 128x36
    [7] LI.ui-menu-item @11,93 126x17
      [8] DIV#ui-id-2.ui-menu-item-wrapper 'Andorra' @11,93 126x17
    [9] LI.ui-menu-item @11,110 126x17
      [10] DIV#ui-id-3.ui-menu-item-wrapper 'Antarctica' @11,110 126x17"""


@pytest.mark.parametrize("action_space", ["coordinates", "elements"])
def test_autocomplete_types_the_start_waits_for_the_menu_completes_closes_and_submits(action_space):
    utterance = 'Enter an item that starts with "An" and ends with "ica".'

    def act(field, menu=""):
        obs = _page("use-autocomplete", utterance, AUTOCOMPLETE.format(field=field, menu=menu), action_space)
        return oracle_action(obs, action_space)

    elements = action_space == "elements"
    assert act("") == (A.FillElement(4, "An") if elements else A.Click("left_click", *_click_of(AUTOCOMPLETE, 4)))
    assert act(" value='An' focused") == A.Wait(0.5)  # for the menu
    typed = act(" value='An' focused", MENU)  # the whole name of the item that fits
    assert typed == (A.FillElement(4, "Antarctica") if elements else A.Type("tarctica"))
    assert act(" value='Antarctica' focused", MENU.replace("'Andorra'", "'Antarctica'")) == A.Key(("tab",))
    submit = act(" value='Antarctica'")
    assert submit == A.ClickElement(5) if elements else _pixel(submit)[1] in range(97, 128)


def _click_of(dom_text, ref):
    element = next(e for e in dom_from_text(dom_text.format(field="", menu="")) if e.ref == ref)
    return click_element(element, TASK_WIDTH, TASK_HEIGHT).x, click_element(element, TASK_WIDTH, TASK_HEIGHT).y


TREE = """[1] BODY @0,0 500x210
  [2] UL#tree.filetree.treeview @2,52 156x45
    [3] LI @2,52 156x15
      [4] SPAN.file 'Alan' @18,53 140x13
    [5] LI.expandable @2,67 156x15
      [6] DIV.hitarea.expandable-hitarea @2,68 16x16
      [7] SPAN.folder 'Olin' @18,68 140x13{inside}"""


def test_tree_opens_closed_folders_until_the_name_shows():
    utterance = 'Navigate through the file tree. Find and click on the folder or file named "Briana".'
    closed = _page("navigate-tree", utterance, TREE.format(inside=""), "elements")
    assert oracle_action(closed, "elements") == A.ClickElement(7)
    opened = TREE.format(
        inside="\n      [8] UL @2,82 156x15\n        [9] LI @2,82 156x15\n"
        "          [10] SPAN.file 'Briana' @34,83 124x13"
    ).replace("LI.expandable", "LI.collapsable")
    assert oracle_action(_page("navigate-tree", utterance, opened, "elements"), "elements") == A.ClickElement(10)


def test_shape_and_grid_scripts_read_svg_elements():
    shape = """[1] DIV#area @0,50 160x151
  [2] svg#area_svg @55,62 50x50
    [3] {figure} @67,66 19x35
  [4] DIV#area-buttons @2,124 156x75
    [5] BUTTON 'Rectangle' @8,126 82x21
    [6] BUTTON 'Circle' @98,126 53x21
    [7] BUTTON 'Triangle' @14,151 68x21
    [8] BUTTON 'Letter' @90,151 56x21
    [9] BUTTON 'Number' @45,176 70x21"""
    utterance = "Click the button that best describes the figure below."
    for figure, ref in (("text '7'", 9), ("text 'q'", 8), ("polygon", 7), ("circle", 6), ("rect", 5)):
        obs = _page("identify-shape", utterance, shape.format(figure=figure), "elements")
        assert oracle_action(obs, "elements") == A.ClickElement(ref), figure
    grid = "[1] svg @4,54 150x150\n  [2] circle#(-2,2) @15,65 8x8\n  [3] circle#(1,-2) @105,185 8x8"
    assert oracle_action(
        _page("grid-coordinate", "Click on the grid coordinate (1,-2).", grid, "elements"), "elements"
    ) == A.ClickElement(3)
