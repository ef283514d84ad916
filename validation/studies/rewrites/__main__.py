"""``python -m validation.studies.rewrites [--quick] [--out DIR] [--scenarios a,b] [--workers N]``."""

from __future__ import annotations

from validation.studies.rewrites import main

if __name__ == "__main__":
    main()
