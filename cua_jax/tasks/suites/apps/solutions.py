"""Scripted solutions of the apps suite: for each task, the replies that solve it (the tests
expect reward 1; an untouched run, no reply but `done`, must score 0). Each setting is the
application's own configuration file, which is what the task's getter reads: the replies
open a terminal (ctrl+alt+t), quit the application (each rewrites its file on exit), and
change the file, as a user who knows where the setting lives would. The suite's tasks name
OSWorld's snapshots (chrome, gimp, vlc, thunderbird, base_setup), which run on the
osworld_apps image."""

from __future__ import annotations

import pathlib

from cua_jax.envs import actions as A

SUITE_DIR = pathlib.Path(__file__).parent
IMAGE = "osworld_apps"


def _in_terminal(*lines: str, wait: float = 2.0) -> list[str]:
    """Open a terminal, type each command line, let them finish, declare done."""
    actions = [A.Key(("ctrl", "alt", "t")), A.Wait(2.0), *(A.Type(line + "\n") for line in lines), A.Wait(wait)]
    return [A.render_action(a) for a in (*actions, A.Done())]


# Waits until no live process matches: an application the environment server started stays a
# zombie until the server reaps it, and pgrep alone lists zombies.
_QUIT = "pkill {pattern}; while pgrep {pattern} | xargs -r -n1 ps -o stat= -p | grep -qv Z; do sleep 0.2; done"
_PREFERENCES = "~/.config/google-chrome/Default/Preferences"
_THUNDERBIRD_PREFS = "~/.thunderbird/t5q2a5hp.default-release/prefs.js"

SOLUTIONS: dict[str, list[str]] = {
    "chrome-do-not-track": _in_terminal(
        _QUIT.format(pattern="-f ^/usr/lib/chromium/"),
        "python3 -c \"import json, os; p = os.path.expanduser('" + _PREFERENCES + "'); d = json.load(open(p)); "
        "d['enable_do_not_track'] = True; json.dump(d, open(p, 'w'))\"",
    ),
    "gimp-undo-levels": _in_terminal(
        "pkill -KILL -x gimp",  # GIMP would rewrite gimprc as it quits
        "mkdir -p ~/.config/GIMP/2.10 && echo '(undo-levels 100)' >> ~/.config/GIMP/2.10/gimprc",
    ),
    "vlc-max-volume": _in_terminal(
        _QUIT.format(pattern="-x vlc"),
        "sed -i 's/^\\[qt\\].*/&\\nqt-max-volume=200/' ~/.config/vlc/vlcrc",
    ),
    "thunderbird-new-mail-alert": _in_terminal(
        _QUIT.format(pattern="-x thunderbird"),  # Thunderbird rewrites prefs.js as it quits
        'sed -i \'s/"mail.biff.show_alert", false/"mail.biff.show_alert", true/\' ' + _THUNDERBIRD_PREFS,
    ),
    "nautilus-bookmark": _in_terminal(
        "mkdir -p ~/.config/gtk-3.0 && echo file:///home/user/Projects >> ~/.config/gtk-3.0/bookmarks",
    ),
}
UNTOUCHED: list[str] = [A.render_action(A.Done())]
