"""Scripted solutions of the os suite: for each task, a reply sequence that solves it and a
near miss that does not (the tests expect rewards 1 and 0). Each reply is the text a policy
would emit, rendered from the action grammar. Most tasks start with a terminal open (their
setup launches GNOME Terminal); the replies click into it and type shell commands, as an
agent would. The suite runs in the osworld image (launch/images/osworld)."""

from __future__ import annotations

import json
import pathlib

from cua_jax.envs import actions as A

SUITE_DIR = pathlib.Path(__file__).parent
IMAGE = "osworld"


def _texts(*actions: A.Action) -> list[str]:
    return [A.render_action(a) for a in actions]


def _terminal(*lines: str, wait: float = 1.0) -> list[str]:
    """Click into the open terminal, type each command line, let them finish, declare done."""
    typed = [A.Type(line + "\n") for line in lines]
    return _texts(A.Click("left_click", 500, 500), *typed, A.Wait(wait), A.Done())


def _editor_append(line: str, save: bool) -> list[str]:
    keys = [A.Key(("ctrl", "end")), A.Type(line + "\n")]
    if save:
        keys.append(A.Key(("ctrl", "s")))
    return _texts(*keys, A.Wait(1.0), A.Done())


SUDO = "echo password | sudo -S"

SOLUTIONS: dict[str, list[str]] = {
    "create-desktop-folder": _terminal("mkdir ~/Desktop/projects"),
    "rename-desktop-file": _terminal("mv ~/Desktop/draft_report.txt ~/Desktop/final_report.txt"),
    "copy-jpgs-recursively": _terminal(
        "mkdir -p ~/Desktop/cpjpg && find ~/photos -type f -name '*.jpg' -exec cp {} ~/Desktop/cpjpg/ \\;"
    ),
    "delete-tmp-files": _terminal("find ~/Documents/cache -type f -name '*.tmp' -delete"),
    "make-script-executable": _terminal("chmod +x ~/Desktop/backup.sh"),
    "set-file-permissions": _terminal("find ~/Documents/reports -type f -exec chmod 644 {} +"),
    "count-log-lines": _terminal("wc -l < ~/Documents/server.log > ~/Desktop/line_count.txt"),
    "archive-folder": _terminal("tar -czf ~/Desktop/notes.tar.gz -C ~/Documents notes"),
    "extract-archive": _terminal("tar -xzf ~/Downloads/site.tar.gz -C ~/Desktop"),
    "add-user-account": _terminal(f"{SUDO} useradd -m -s /bin/bash charles"),
    "join-group": _terminal(f"{SUDO} usermod -aG developers user"),
    "set-timezone": _terminal(f"{SUDO} ln -sf /usr/share/zoneinfo/Asia/Tokyo /etc/localtime"),
    "bash-alias": _terminal("echo \"alias ll='ls -alF'\" >> ~/.bashrc"),
    "extend-path": _terminal("echo 'export PATH=\"$PATH:$HOME/tools/bin\"' >> ~/.bashrc"),
    "dark-color-scheme": _terminal("gsettings set org.gnome.desktop.interface color-scheme prefer-dark"),
    "disable-screen-lock": _terminal("gsettings set org.gnome.desktop.screensaver lock-enabled false"),
    "text-scaling": _terminal("gsettings set org.gnome.desktop.interface text-scaling-factor 1.25"),
    "hosts-entry": _terminal(f"{SUDO} sh -c \"echo '192.0.2.10 intranet.example' >> /etc/hosts\""),
    "largest-file-name": _terminal("ls -S ~/Documents/data | head -n 1 > ~/Desktop/largest.txt"),
    "enable-autosave-setting": _terminal(
        'sed -i \'s/"autosave": false/"autosave": true/\' ~/.config/notes-app/settings.json'
    ),
    "convert-csv-to-xlsx": _terminal(
        "soffice --headless --convert-to xlsx --outdir ~/Desktop ~/Documents/sales.csv", wait=2.0
    ),
    "stop-runaway-process": _terminal("pkill -x data-sync"),
    "python-hello-script": _terminal("echo 'print(\"Hello, OSWorld!\")' > ~/Desktop/hello.py"),
    "desktop-symlink": _terminal("ln -s ~/Documents ~/Desktop/docs"),
    "replace-in-config": _terminal("sed -i 's/old-server/new-server/g' ~/Documents/config.ini"),
    "editor-append-line": _editor_append("buy milk", save=True),
    "infeasible-bluetooth-pairing": _texts(A.Screenshot(), A.Fail()),
}

WRONG_SOLUTIONS: dict[str, list[str]] = {
    "create-desktop-folder": _terminal("mkdir ~/projects"),
    "rename-desktop-file": _terminal("cp ~/Desktop/draft_report.txt ~/Desktop/final_report.txt"),
    "copy-jpgs-recursively": _terminal("mkdir -p ~/Desktop/cpjpg && cp ~/photos/*.jpg ~/Desktop/cpjpg/"),
    "delete-tmp-files": _terminal("rm ~/Documents/cache/*.tmp"),
    "make-script-executable": _terminal("chmod u+x ~/Desktop/backup.sh"),
    "set-file-permissions": _terminal("chmod -R 644 ~/Documents/reports"),
    "count-log-lines": _terminal("wc -l ~/Documents/server.log > ~/Desktop/line_count.txt"),
    "archive-folder": _terminal("tar -cf ~/Desktop/notes.tar.gz -C ~/Documents notes"),
    "extract-archive": _terminal("tar -xzf ~/Downloads/site.tar.gz"),
    "add-user-account": _terminal(f"{SUDO} useradd charles"),
    "join-group": _terminal(f"{SUDO} usermod -aG sudo user"),
    "set-timezone": _terminal("export TZ=Asia/Tokyo"),
    "bash-alias": _terminal("alias ll='ls -alF'"),
    "extend-path": _terminal('export PATH="$PATH:$HOME/tools/bin"'),
    "dark-color-scheme": _terminal("gsettings set org.gnome.desktop.interface gtk-theme Adwaita-dark"),
    "disable-screen-lock": _terminal("gsettings set org.gnome.desktop.session idle-delay 0"),
    "text-scaling": _terminal("gsettings set org.gnome.desktop.interface text-scaling-factor 1.5"),
    "hosts-entry": _terminal(f"{SUDO} sh -c \"echo '192.0.2.11 intranet.example' >> /etc/hosts\""),
    "largest-file-name": _terminal("ls ~/Documents/data | head -n 1 > ~/Desktop/largest.txt"),
    "enable-autosave-setting": _texts(
        A.WriteFile("/home/user/.config/notes-app/settings.json", json.dumps({"autosave": True})), A.Done()
    ),
    "convert-csv-to-xlsx": _terminal("cp ~/Documents/sales.csv ~/Desktop/sales.xlsx"),
    "stop-runaway-process": _terminal("pkill -x sleep"),
    "python-hello-script": _terminal("echo 'print(\"Hello, World!\")' > ~/Desktop/hello.py"),
    "desktop-symlink": _terminal("cp -r ~/Documents ~/Desktop/docs"),
    "replace-in-config": _terminal("sed -i 's/old-server/new-server/' ~/Documents/config.ini"),
    "editor-append-line": _editor_append("buy milk", save=False),
    "infeasible-bluetooth-pairing": _texts(A.Done()),
}
