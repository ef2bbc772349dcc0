"""Double of modules/errors.py (WebUI 1.10.1).

``report`` prints ``*** message`` lines and the indented traceback to stderr, like the real
``report`` (~L38-50). Every call is also appended to ``reported`` so tests can assert that an
exception was swallowed-and-logged instead of propagated.
"""

import sys
import textwrap
import traceback

reported = []
"""(message, exception or None) for every report()/display() call; test-only addition."""

exception_records = []


def _record():
    exc = sys.exc_info()[1]
    if exc is not None and (not exception_records or exception_records[-1] is not exc):
        exception_records.append(exc)
        del exception_records[:-5]  # the real keeps the last 5 (record_exception ~L25-35)
    return exc


def report(message: str, *, exc_info: bool = False) -> None:
    # mirrors modules/errors.py report ~L38-50
    exc = _record()
    reported.append((message, exc))
    for line in message.splitlines():
        print("***", line, file=sys.stderr)
    if exc_info:
        print(textwrap.indent(traceback.format_exc(), "    "), file=sys.stderr)
        print("---", file=sys.stderr)


def display(e: Exception, task, *, full_traceback=False):
    # mirrors modules/errors.py display ~L64-72 (task name, exception type, formatted traceback)
    _record()
    reported.append((task, e))
    print(f"{task or 'error'}: {type(e).__name__}", file=sys.stderr)
    print(*traceback.TracebackException.from_exception(e).format(), sep="", file=sys.stderr)


def print_error_explanation(message):
    print(message, file=sys.stderr)


def clear():
    """Test-only: forget what was reported."""
    reported.clear()
    exception_records.clear()
