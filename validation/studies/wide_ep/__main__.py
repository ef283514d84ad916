"""``python -m validation.studies.wide_ep``: the study outside Hydra (:func:`validation.studies.wide_ep.main`)."""

from simcore.files import dumps
from validation.studies.wide_ep import main

if __name__ == "__main__":
    summary = main()
    print(dumps({k: v for k, v in summary.items() if not isinstance(v, list)}))
