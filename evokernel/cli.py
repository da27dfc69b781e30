"""What the command-line entry points share: logging set-up and the one-line error exit.

The library logs through one logger per module and never prints; a CLI calls
:func:`configure_logging` once, which sends evokernel's records to stderr as
``<prog>: <message>`` (``<prog>: warning: <message>`` for warnings).
"""

from __future__ import annotations

import logging
import shlex
import sys
from pathlib import Path

EXIT_USAGE = 2
"""Exit status of every error a user can fix: bad config, unknown name, corrupt or locked run."""


class _Format(logging.Formatter):
    def __init__(self, prog: str) -> None:
        super().__init__()
        self.prog = prog

    def format(self, record: logging.LogRecord) -> str:
        level = "" if record.levelno < logging.WARNING else f"{record.levelname.lower()}: "
        return f"{self.prog}: {level}{record.getMessage()}"


def configure_logging(prog: str, level: int = logging.INFO) -> None:
    """Route the ``evokernel`` loggers to stderr for the command ``prog``."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Format(prog))
    root = logging.getLogger("evokernel")
    root.handlers = [handler]
    root.setLevel(level)
    root.propagate = False


def fail(prog: str, message: str) -> int:
    """Print ``message`` as the command's error and return the usage exit status."""
    print(f"{prog}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def command_line() -> str:
    """This process's command as a user would type it (``python -m evokernel.<cli> ...``)."""
    script = Path(sys.argv[0]) if sys.argv and sys.argv[0] else Path("python")
    package = Path(__file__).resolve().parent
    head = f"python {shlex.quote(sys.argv[0])}" if sys.argv and sys.argv[0] else "python"
    if script.suffix == ".py" and package in script.resolve().parents:
        module = ".".join(script.resolve().relative_to(package.parent).with_suffix("").parts)
        head = f"python -m {module.removesuffix('.__main__')}"
    return " ".join([head, *map(shlex.quote, sys.argv[1:])])
