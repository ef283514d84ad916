"""``python -m validation.studies.collectives``: the study's command line; bad input is one line, exit 2."""

from __future__ import annotations

import sys

from validation.studies.collectives import main

if __name__ == "__main__":
    try:
        main()
    except ValueError as exc:  # bad input (an unknown fabric, a malformed header): one line, exit 2
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        sys.exit(2)
