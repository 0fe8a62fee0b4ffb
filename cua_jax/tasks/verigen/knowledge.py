"""The knowledge document of the desktop environment: what the proposer may build on."""

DESKTOP_KNOWLEDGE = """Desktop environment (cua_jax desktop image, Debian, X11, one screen 1280x800, no network).
User: root, home /root (writable), /tmp writable. Python 3 (standard library) is available to judges.
Applications:
- terminal: xterm (launch ["xterm", "-fa", "DejaVu Sans Mono", "-fs", "12"]); shell commands: mkdir, mv, cp,
  printf, cat, ls. Tasks: create / rename / move files, make directory trees.
- text editor: mousepad (setup step {"type": "open", "parameters": {"path": "<file>.txt"}} opens a text file).
  Tasks: edit a line, append a line, replace a word, save with ctrl+s.
- spreadsheet: gnumeric (open an .xlsx file; ssconvert converts csv <-> xlsx in setup). Tasks: fill cells
  with values or formulas, save with ctrl+s (xlsx keeps formulas and cached values).
Actions: click / type / key / scroll / wait / write_file(path, content) / done / fail (cua_jax action grammar).
Setup steps: execute {command, shell}, launch {command}, open {path}, upload, download (local files), sleep.
Judges: a Python function of no arguments, run inside the environment, that reads files and returns 1.0 or 0.0.
"""
