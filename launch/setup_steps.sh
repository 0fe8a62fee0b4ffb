# The step runner of launch/setup.sh (sourced; defines functions only). Each step prints one line
# on stderr, "[setup] <what> ... <result>"; the output of the commands it runs goes to a log file.
# A failing command ends the step's line with "failed", prints the last 40 lines the step wrote
# to the log and the log's path, and exits with the command's status.
#
#   setup_log_start DIR      a new log DIR/setup-<UTC time>-<pid>.log (SETUP_LOG); prints its path
#   setup_step WHAT          starts a step's line
#   setup_run PROGRAM ARG... runs a program (not a shell function) with its output in the log
#   setup_step_output        what the current step's commands wrote to the log
#   setup_done RESULT        ends the step's line with RESULT (and the seconds taken, when any)

SETUP_TAIL_LINES=40
_setup_step_what=setup
_setup_step_offset=0
_setup_step_started="$SECONDS"

setup_log_start() {
  mkdir -p "$1"
  # A log per run (runs on one machine may overlap); those older than a week are removed.
  find "$1" -maxdepth 1 -name 'setup-*.log' -mtime +7 -delete 2>/dev/null || true
  SETUP_LOG="$1/setup-$(date -u +%Y%m%d-%H%M%S)-$$.log"
  : > "$SETUP_LOG"
  printf '[setup] log: %s\n' "$SETUP_LOG" >&2
}

setup_step() {
  _setup_step_what="$1"
  _setup_step_offset="$(stat -c %s "$SETUP_LOG")"
  _setup_step_started="$SECONDS"
  printf '\n==== %s (%s)\n' "$1" "$(date -u +%H:%M:%S)" >> "$SETUP_LOG"
  printf '[setup] %s ... ' "$1" >&2
}

setup_step_output() {
  tail -c "+$((_setup_step_offset + 1))" "$SETUP_LOG"
}

setup_done() {
  local elapsed=$((SECONDS - _setup_step_started))
  if [ "$elapsed" -gt 0 ]; then
    printf '%s (%d s)\n' "$1" "$elapsed" >&2
  else
    printf '%s\n' "$1" >&2
  fi
}

setup_run() {
  # Where a status is tested, bash ignores `set -e` inside shell functions: a function's failing
  # command would not stop it, so only programs are run.
  if [ "$(type -t "$1")" = function ]; then
    printf '\n[setup] setup_run runs programs, not shell functions: %s\n' "$1" >&2
    exit 2
  fi
  printf '$ %s\n' "$*" >> "$SETUP_LOG"
  local status=0
  # fd 9 (setup.sh's lock) is closed for the program: a daemon it starts must not hold the lock.
  "$@" >> "$SETUP_LOG" 2>&1 < /dev/null 9>&- || status=$?
  if [ "$status" -ne 0 ]; then
    printf 'failed (exit %d)\n' "$status" >&2
    setup_step_output | tail -n "$SETUP_TAIL_LINES" >&2
    printf '[setup] %s failed (exit %d); full log: %s\n' "$_setup_step_what" "$status" "$SETUP_LOG" >&2
    exit "$status"
  fi
}
