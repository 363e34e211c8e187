"""`python -m agent_server.process.drill.declared APP APP_DIR`: the drill's `--next` reads
an app's declarations here (drill/versions.py). APP is imported as `agent-server run`
imports it ('' for the demo agent), in this interpreter of its own, and each reasoner's
declaration is printed as one JSON line: what the claim of a checkpoint compares. A module
nothing imports: it needs `load_agent`, and the CLI that loads it imports the drill."""

from __future__ import annotations

import json
import sys

from agent_server.process.cli_server import AppLoadError, load_agent
from agent_server.runtime.exits import ExitCode


def main(argv: list[str]) -> int:
    app, app_dir = argv[0] or None, argv[1]
    try:
        agent = load_agent(app, app_dir)
    except AppLoadError as exc:
        if exc.traceback:
            print(exc.traceback.rstrip("\n"), file=sys.stderr)
        print(exc, file=sys.stderr)
        return int(ExitCode.INVALID_SETTINGS)
    declared = {
        name: {
            "resumable": reasoner.resumable,
            "retry": reasoner.retry is not None,
            "version": reasoner.versions.version,
            "compatible": sorted(reasoner.versions.compatible, key=lambda v: (v is None, v or "")),
            "migrates": reasoner.versions.migrate is not None,
            "on_version_change": reasoner.versions.on_version_change.value,
        }
        for name, reasoner in agent.reasoners.items()
    }
    print(json.dumps(declared))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
