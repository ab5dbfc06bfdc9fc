"""Tell one notice to a user's targets, in a process of its own (agents/notifier.py starts it
and ends it past its deadline): `python -m aso.notify_send` reads {"urls", "title", "body"} as
JSON on stdin and exits 0 when every target took the notice, 1 otherwise. Only apprise is
imported here, so that a notice costs the start of a small interpreter."""

from __future__ import annotations

import json
import sys


def main() -> int:
    import apprise

    notice = json.load(sys.stdin)
    targets = apprise.Apprise()
    for url in notice["urls"]:
        targets.add(url)
    return 0 if targets.notify(title=notice["title"], body=notice["body"]) else 1


if __name__ == "__main__":
    sys.exit(main())
