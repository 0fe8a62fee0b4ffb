"""Entry point: python3 -m cua_jax.envs.server --socket /run/cua/env.sock --start-display"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from cua_jax.envs.server.app import Environment, make_server
from cua_jax.envs.server.display import Display


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the in-environment OSWorld-protocol server")
    parser.add_argument("--socket", help="Unix socket path (the default transport)")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, help="serve on TCP instead; needs a token")
    parser.add_argument("--token-file", help="file holding the bearer token for TCP")
    parser.add_argument("--display", default=os.environ.get("DISPLAY", ":0"))
    parser.add_argument("--screen", default="1280x800", help="WIDTHxHEIGHT of the virtual screen")
    parser.add_argument("--start-display", action="store_true", help="start Xvfb and the window manager")
    parser.add_argument("--window-manager", default="matchbox-window-manager -use_titlebar no -use_cursor yes")
    parser.add_argument("--start-timeout", type=float, default=180.0,
                        help="seconds Xvfb and the window manager may take to come up (busy hosts are slow)")
    parser.add_argument("--home", default=os.environ.get("HOME", "/root"))
    args = parser.parse_args(argv)
    if (args.socket is None) == (args.port is None):
        parser.error("give exactly one of --socket and --port")

    display = Display(args.display)
    if args.start_display:
        width, height = (int(v) for v in args.screen.lower().split("x"))
        display.start(width, height, args.window_manager.split(), timeout=args.start_timeout)
    else:
        display.connect()
    token = None
    if args.port is not None:
        if not args.token_file:
            parser.error("--port needs --token-file")
        token = open(args.token_file).read().strip()
    server = make_server(Environment(display, args.home), args.socket, args.host, args.port or 0, token)

    def stop(signum, frame):
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    print(f"[env-server] ready on {args.socket or f'{args.host}:{server.server_address[1]}'}",
          file=sys.stderr, flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        display.stop()


if __name__ == "__main__":
    main()
