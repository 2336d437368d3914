"""One line, not a traceback, for a Ctrl-C that lands while perdure is being imported.

``perdure --help`` spends most of its first second importing (perdure itself, click,
rich); a Ctrl-C then raises ``KeyboardInterrupt`` in the middle of some module's import,
before the command line's own handler exists. Importing this module (the first thing
``perdure/__init__.py`` does) calls ``quiet_import_interrupts``, which wraps
``sys.excepthook`` so that such an interrupt,
one whose traceback runs through the top level of a perdure module, prints
``interrupted`` instead. Every other exception, and a Ctrl-C at any other moment, goes
to the hook that was there before. Python still ends the process as killed by SIGINT
(exit status 130 in a shell), as for any unhandled Ctrl-C.
"""

from __future__ import annotations

import sys
from types import TracebackType

__all__ = ["quiet_import_interrupts"]


def _importing_perdure(tb: TracebackType | None) -> bool:
    """Whether ``tb`` passes through a perdure module's top level (an import of it)."""
    while tb is not None:
        frame = tb.tb_frame
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "<module>" and isinstance(name, str) and (
                name == "perdure" or name.startswith("perdure.")):
            return True
        tb = tb.tb_next
    return False


def quiet_import_interrupts() -> None:
    """Install the hook once, over Python's default one only (a debugger's, IPython's or
    pytest's own hook is left alone)."""
    before = sys.excepthook
    if before is not sys.__excepthook__:
        return

    def hook(kind: type[BaseException], value: BaseException,
             tb: TracebackType | None) -> None:
        if issubclass(kind, KeyboardInterrupt) and _importing_perdure(tb):
            sys.stderr.write("interrupted\n")
            return
        before(kind, value, tb)

    sys.excepthook = hook


quiet_import_interrupts()
