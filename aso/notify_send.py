"""Tell one notice to a user's targets, in a process of its own (agents/notifier.py starts it
and ends it past its deadline): `python -m aso.notify_send` imports apprise, says `ready` on
stdout, then reads {"urls", "title", "body"} as JSON on stdin and exits 0 when every target took
the notice, 1 otherwise. The notifier's deadline runs from `ready`: a busy host's slow start is
not a target's slowness."""

from __future__ import annotations

import json
import sys

READY = "ready"


def main() -> int:
    import apprise

    print(READY, flush=True)
    notice = json.load(sys.stdin)
    targets = apprise.Apprise()
    for url in notice["urls"]:
        targets.add(url)
    return 0 if targets.notify(title=notice["title"], body=notice["body"]) else 1


if __name__ == "__main__":
    sys.exit(main())
