"""The ``bayesmlc`` command line: a thin layer over the library.

file -> Dataset -> estimator.fit -> scores and probabilities -> metrics -> report
(:mod:`bayesmlc.evaluation` does the scoring and the metrics).

The package: :mod:`.parser` (the commands' options and argument types), :mod:`.commands` (one module
per command), :mod:`.run_directory` (the ``--out`` folder), :mod:`.output` (what is printed and
written), :mod:`.threads` and :mod:`.errors`; :func:`main` runs one command.

Exit codes: 0 success; 2 bad arguments, bad input or a failed run (one line ``bayesmlc: error: ...``
naming the argument, file or line; no traceback); 130 interrupted (Ctrl-C); 1 an unexpected internal
error (one line; ``BAYESMLC_TRACEBACK=1`` shows the traceback).

``train --out DIR`` writes the run into a marked temporary folder and moves it into ``DIR`` when
everything is written, never moving the folder's own files; a failure or Ctrl-C during the move
leaves ``DIR`` as it was; an existing run is replaced only with ``--overwrite``
(:mod:`bayesmlc.cli.run_directory`).
"""

from __future__ import annotations

import os
import sys

from ..evaluation import MAX_EVALUATION_ENTRIES
from ..parameters import parse_set_values
from .commands import (cmd_bench, cmd_demo, cmd_evaluate, cmd_info, cmd_plot_history, cmd_predict, cmd_topics,
                       cmd_train)
from .commands.demo import DEMO_FEATURES, DEMO_LABELS, DEMO_MIN_SAMPLES, DEMO_SETTINGS
from .commands.train import MIN_TRAIN_ROWS, build_model
from .errors import EXIT_INTERNAL, EXIT_INTERRUPTED, EXIT_OK, EXIT_USAGE, CLIError, describe_error
from .output import one_line_warnings, printable
from .parser import build_parser
from .threads import MAX_THREADS_PER_CORE, command_threads, max_threads

__all__ = [
    "main", "build_parser", "build_model", "parse_set_values", "describe_error", "max_threads", "CLIError",
    "cmd_bench", "cmd_demo", "cmd_evaluate", "cmd_info", "cmd_plot_history", "cmd_predict", "cmd_topics", "cmd_train",
    "EXIT_OK", "EXIT_INTERNAL", "EXIT_USAGE", "EXIT_INTERRUPTED", "MAX_EVALUATION_ENTRIES", "MAX_THREADS_PER_CORE",
    "MIN_TRAIN_ROWS", "DEMO_FEATURES", "DEMO_LABELS", "DEMO_MIN_SAMPLES", "DEMO_SETTINGS",
]


def _exit_interrupted() -> None:
    """End the process with exit code 130 after its exit handlers have run.

    Returning 130 through interpreter shutdown is not enough: a second Ctrl-C while Python finalises
    (or a KeyboardInterrupt that the interpreter has already recorded as unhandled) makes CPython kill
    itself with SIGINT instead, so a script sees -2 rather than the documented 130. Later interrupts
    are ignored; the exit handlers (temporary folders, progress bars) still run."""
    import atexit
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
    finally:
        os._exit(EXIT_INTERRUPTED)


def main(argv=None) -> int:
    """Run one command; returns the exit code (see the module docstring). Every failure is one line
    on stderr."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        with one_line_warnings(), command_threads(args):
            code = args.func(args)
        sys.stdout.flush()  # a full disk or a closed pipe shows here, not at exit
        return code
    except BrokenPipeError:
        # the reader closed the pipe (``bayesmlc predict ... | head``): stop quietly, as Unix tools do
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except KeyboardInterrupt:
        print("bayesmlc: interrupted", file=sys.stderr)
        if argv is None:  # the process's own command line: end it here, with the documented code
            _exit_interrupted()
        return EXIT_INTERRUPTED
    except Exception as exc:
        if os.environ.get("BAYESMLC_TRACEBACK"):
            raise
        code, message = describe_error(exc)
        print(f"bayesmlc: error: {printable(' '.join(message.split()))}", file=sys.stderr)
        return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
