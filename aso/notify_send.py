"""Tell one notice to a user's targets, in a process of its own (agents/notifier.py starts it
and ends it past its deadline): `python -m aso.notify_send` reads {"urls", "title", "body"} as
JSON on stdin, imports apprise and makes the targets of the URLs (apprise loads its plugins
then), says `ready` on stdout, tells the notice and says `sent` when every target took it,
`failed` otherwise. The notifier's deadline runs from `ready` to that answer: a busy host's
slow start (the interpreter, apprise and its plugins) is not a target's slowness, and neither
is the interpreter's exit after it."""

from __future__ import annotations

import json
import sys

READY, SENT, FAILED = "ready", "sent", "failed"


def main() -> int:
    notice = json.load(sys.stdin)
    import apprise

    targets = apprise.Apprise()
    for url in notice["urls"]:
        targets.add(url)
    print(READY, flush=True)
    told = targets.notify(title=notice["title"], body=notice["body"])
    print(SENT if told else FAILED, flush=True)
    return 0 if told else 1


if __name__ == "__main__":
    sys.exit(main())
