"""Loaded by every Python process the tests start (tests/conftest.py puts
this folder on PYTHONPATH): SIGUSR1 makes a server print every thread's
stack to stderr, and SIGUSR2 every trio task's await stack (a request
waiting on an event shows only there: its thread sits idle in epoll), so a
test that timed out waiting on a server can show where the server stood
(conftest's failure report sends both)."""

import faulthandler
import os
import select
import signal

TASKS_HEADER = "trio tasks (innermost await last):"
_dumping = False


def _write_all(fd: int, data: bytes) -> None:
    while data:
        try:
            data = data[os.write(fd, data):]
        except BlockingIOError:
            select.select([], [fd], [])
        except OSError:  # stderr gone: raised here, it would land in the interrupted loop
            return


def _print_trio_tasks(signum, frame) -> None:
    # The handler runs on the trio thread between any two bytecodes, so it
    # takes no lock: sys.stderr is the server's RedactingStream, whose lock
    # a dump interrupted in its own write (a full pipe) would wait on
    # forever, wedging the event loop.  A second signal meanwhile is dropped.
    global _dumping
    if _dumping:
        return
    _dumping = True
    try:
        try:
            import trio
            root = trio.lowlevel.current_root_task()
        except Exception:   # not inside trio.run (yet, or any more)
            return
        lines = [TASKS_HEADER]

        def walk(task, depth: int) -> None:
            lines.append(f"{'  ' * depth}- {task.name}")
            for f, lineno in task.iter_await_frames():
                if "/trio/_core/" in f.f_code.co_filename:
                    continue
                lines.append(f"{'  ' * depth}    {f.f_code.co_filename}:{lineno} "
                             f"in {f.f_code.co_name}")
            for nursery in task.child_nurseries:
                for child in nursery.child_tasks:
                    walk(child, depth + 1)
        walk(root, 0)
        _write_all(2, ("\n".join(lines) + "\n").encode("utf-8", "replace"))
    finally:
        _dumping = False


if os.environ.get("MLXCEL_TEST_STACKS") == "1":
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    signal.signal(signal.SIGUSR2, _print_trio_tasks)
