"""SIGINT and SIGTERM as one exception for the command lines (``python -m decoding``,
bench/run.py): each installs :func:`raising` around its work and, on :class:`Interrupted`,
keeps what it finished, says so in one line and exits with the shell's status for the signal
(128 + its number: 130 for SIGINT, 143 for SIGTERM). Library code installs nothing: a handler
is the process's, so only an entry point may set one."""

import signal
import threading
from contextlib import contextmanager
from typing import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(KeyboardInterrupt):
    """A signal asked the process to stop. A KeyboardInterrupt, so that code which cleans up
    after Ctrl-C (a server child stopped, a cache released) does the same for SIGTERM, and so
    that ``except Exception`` on the way up does not swallow it."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.name = signal.Signals(signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


def name_and_code(e: KeyboardInterrupt) -> tuple[str, int]:
    """(signal name, exit status) of an interrupt; a plain KeyboardInterrupt (no handler of
    ours was installed: a caller of ``main()`` in-process) is a SIGINT."""
    if isinstance(e, Interrupted):
        return e.name, e.exit_code
    return "SIGINT", 128 + signal.SIGINT


def _raise(signum, frame) -> None:
    raise Interrupted(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()  # signal.signal works there only


@contextmanager
def raising() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM raise :class:`Interrupted` (SIGTERM would otherwise end
    the process on the spot, with nothing written); the previous handlers come back after."""
    if not _main_thread():
        yield
        return
    old = {s: signal.signal(s, _raise) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)


@contextmanager
def held() -> Iterator[None]:
    """While inside, SIGINT and SIGTERM are ignored: the few writes after an interrupt finish
    before a second Ctrl-C could cut them short."""
    if not _main_thread():
        yield
        return
    old = {s: signal.signal(s, signal.SIG_IGN) for s in SIGNALS}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
