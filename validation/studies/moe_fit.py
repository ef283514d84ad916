"""Compatibility: ``python -m validation.studies.moe_fit`` runs :mod:`validation.studies.moe.fit`."""

from validation.studies.moe.fit import main

__all__ = ["main"]

if __name__ == "__main__":
    main()
