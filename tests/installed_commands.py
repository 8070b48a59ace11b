"""rlsteps commands run by the interpreter of an environment rlsteps was installed into (tests/test_package.py).

    python installed_commands.py COMMANDS_JSON

COMMANDS_JSON is a list of argument lists. Prints one JSON object: where rlsteps was imported from, and for each
command its exit code and what it printed. The commands run one after another in this process (the imports are paid
once), each through the command line's own main(), as `rlsteps ARGS...` runs them.
"""

import contextlib
import io
import json
import sys


def run(argv: list[str]) -> dict:
    from rlsteps.cli.app import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(argv)
    return {"argv": argv, "exit": code, "out": out.getvalue(), "err": err.getvalue()}


if __name__ == "__main__":
    import rlsteps

    commands = json.loads(sys.argv[1])
    print(json.dumps({"rlsteps": rlsteps.__file__, "path": sys.path, "results": [run(argv) for argv in commands]}))
