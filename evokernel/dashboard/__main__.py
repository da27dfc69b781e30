"""``python -m evokernel.dashboard DIR``: serve the live dashboard of a run or a comparison.

Binds to 127.0.0.1 unless ``--host`` says otherwise (the page has no login: anyone
who can reach the port can read the run's sources). Bad input (a missing path, a
directory that is not a run, a port in use) is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import logging
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

EXIT_USAGE = 2
DEFAULT_PORT = 8765
EXAMPLES = """examples:
  python -m evokernel.dashboard runs/dsa_topk-evolutionary-s0-20261203-101500
  python -m evokernel.dashboard runs/compare-dsa_topk-20261203-101500 --port 9000
  python -m evokernel.dashboard runs/my-run --host 0.0.0.0     # reachable from other machines
"""


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m evokernel.dashboard", description=__doc__.splitlines()[0],
                                epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("path", metavar="RUN_OR_COMPARISON_DIR")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    p.add_argument("--poll", type=float, default=1.0, metavar="S", help="seconds between looks at the files")
    return p


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; raises ``OSError`` if it cannot be had."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    prog = "evokernel.dashboard"
    try:
        import uvicorn

        from evokernel.dashboard.server import create_app
        from evokernel.dashboard.target import NotARunError, check
    except ImportError as exc:
        print(f"{prog}: error: {exc.name} is not installed; install evokernel[dashboard]", file=sys.stderr)
        return EXIT_USAGE
    if args.poll <= 0:
        print(f"{prog}: error: --poll {args.poll}: must be positive", file=sys.stderr)
        return EXIT_USAGE
    try:
        root = check(Path(args.path))
        app = create_app(root, poll_s=args.poll)
    except (NotARunError, FileNotFoundError) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    try:
        sock = bind(args.host, args.port)
    except (OSError, OverflowError) as exc:
        why = getattr(exc, "strerror", None) or exc
        print(f"{prog}: error: cannot listen on {args.host}:{args.port}: {why} (try --port)", file=sys.stderr)
        return EXIT_USAGE
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"{prog}: warning: listening on {args.host}: anyone who reaches it can read this run", file=sys.stderr)
    print(f"{prog}: http://{shown}:{port}/ follows {root} (Ctrl-C stops)", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=2, lifespan="off")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
