"""Runs judge code in a desktop container, apart from everything the agent can write there.

The host runs this file from a read-only bind mount (`cua_jax.envs.container_judge`) with
`docker exec ... /usr/bin/python3 -I -S /opt/cua-judge/run_judge.py PAYLOAD` and a fixed PATH:

  -I   no PYTHON* variables (the image's PYTHONPATH=/opt/cua is writable by root), no user
       site-packages, no script or working directory on sys.path;
  -S   no `site`: no sitecustomize / usercustomize and no .pth files from any site directory.
       The system's dist-packages are appended after the standard library below, as plain
       directories, so judges keep the image's installed libraries (python3-xlib, pyatspi)
       without the hooks `site` would run.

PAYLOAD is base64 of JSON {"code", "timeout"}. The code runs as the user the environment's
server runs as (the owner of its socket), in that user's home, like the server's /run_python,
in a process group of its own that is killed whole after `timeout` seconds (exit 124); its
stdout and stderr go back to the host, which reads the verdict from them.
Only the standard library is used here.
"""

import base64
import json
import os
import pwd
import signal
import sys

SERVER_SOCKET = "/run/cua/env.sock"
SYSTEM_PACKAGES = (
    "/usr/lib/python3/dist-packages",
    f"/usr/local/lib/python{sys.version_info[0]}.{sys.version_info[1]}/dist-packages",
)


def become_server_user():
    """Drop to the uid and gid that own the server's socket (the agent's user), with its home."""
    try:
        owner = os.stat(SERVER_SOCKET)
    except OSError:
        return  # no server socket: stay as docker exec started us
    entry = pwd.getpwuid(owner.st_uid)
    if os.getuid() == 0 and owner.st_uid != 0:
        os.initgroups(entry.pw_name, owner.st_gid)
        os.setgid(owner.st_gid)
        os.setuid(owner.st_uid)
    os.environ["HOME"] = entry.pw_dir
    os.environ["USER"] = os.environ["LOGNAME"] = entry.pw_name
    os.chdir(entry.pw_dir)


def main():
    request = json.loads(base64.b64decode(sys.argv[1]))
    for path in SYSTEM_PACKAGES:
        if os.path.isdir(path) and path not in sys.path:
            sys.path.append(path)
    become_server_user()
    # The code runs in a child process group; this process bounds it from outside (a judge stuck
    # in one C call never returns to Python to run a signal handler) and kills the whole group.
    child = os.fork()
    if child == 0:
        os.setpgid(0, 0)
        exec(compile(request["code"], "<judge>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
        return  # the interpreter exits as after any script: output flushed, SystemExit's status, tracebacks
    try:
        os.setpgid(child, child)  # as the child does: whichever runs first, the group exists before a kill
    except OSError:
        pass  # the child already set it, or already exited

    def expire(*_):
        try:
            os.killpg(child, signal.SIGKILL)
        except OSError:
            pass
        sys.stderr.write("judge timed out\n")
        os._exit(124)

    timeout = float(request.get("timeout") or 0)
    if timeout > 0:
        signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, timeout)
    _, status = os.waitpid(child, 0)
    signal.setitimer(signal.ITIMER_REAL, 0)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status))


if __name__ == "__main__":
    main()
