#!/bin/sh
# The window manager of the osworld image (started by the server with its arguments) and
# the key-binding daemon next to it: sxhkd reads ~/.config/sxhkd/sxhkdrc (ctrl+alt+t opens
# a terminal, as on OSWorld's Ubuntu). The window manager replaces this shell, so the
# server watches its process.
sxhkd >/dev/null 2>&1 &
exec matchbox-window-manager "$@"
