"""`python -m ccbench ARGS` without starting Python and importing torch for each call.

Started once per test session (conftest.run_ccbench_forked): it imports ccbench and torch,
then for each request (a JSON line on stdin: argv, env, cwd, stdout and stderr file paths)
forks a child that takes the request's environment and folder, sends its output to the two
files and runs `sys.exit(ccbench.cli.main(argv))` as `python -m ccbench` does: the exit
status, atexit handlers and flushed output are the same; the interpreter's teardown of torch
(~0.55 s, nothing a caller can see) is skipped. It answers the child's pid, then its exit
status (negative: the signal that ended it), one JSON line each. A command-line error costs a
fork (~40 ms) instead of a Python start (~1.2 s on a 2-core machine).

Forking is safe here because this process runs no thread of its own and never measures
anything: every run starts from the same freshly imported state.
"""

from __future__ import annotations

import json
import os
import sys


def _become(request: dict) -> None:
    """In the child: the request's environment, folder and output files."""
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)


def _exit_status(exc: SystemExit) -> int:
    if exc.code is None or isinstance(exc.code, int):
        return exc.code or 0
    print(exc.code, file=sys.stderr)            # sys.exit("message"), as Python prints it
    return 1


def _run_child(request: dict) -> None:
    import atexit

    import ccbench.cli

    code = 1
    try:
        _become(request)
        code = ccbench.cli.main(request["argv"])
    except SystemExit as exc:
        code = _exit_status(exc)
    except BaseException:  # noqa: BLE001  (printed as Python prints an uncaught exception)
        sys.excepthook(*sys.exc_info())
    finally:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _answer(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def serve() -> None:
    import torch  # noqa: F401  (what every ccbench run imports first: once, here)

    import ccbench.bench.runner  # noqa: F401
    import ccbench.cli  # noqa: F401

    for line in sys.stdin:
        request = json.loads(line)
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_child(request)
        _answer({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _answer({"status": os.waitstatus_to_exitcode(status)})


if __name__ == "__main__":
    serve()
