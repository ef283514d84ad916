"""``python -m validation.studies.fidelity [--quick] [--scenarios a b] [--strategies N] [--out DIR]``."""

from __future__ import annotations

from validation.studies.fidelity import main

if __name__ == "__main__":
    main()
