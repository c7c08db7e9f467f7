"""The recipe's logging: one logger per module under ``recipe.rolloutpipe``, in verl's console format, written
through tqdm so that a round's progress bar is not broken by a log line. ``ROLLOUTPIPE_LOGGING_LEVEL`` (default
INFO) sets the level, as ``VERL_LOGGING_LEVEL`` does for verl."""

from __future__ import annotations

import logging
import os

from tqdm import tqdm

FORMAT = "%(levelname)s:%(asctime)s:%(message)s"  # verl's (verl.utils.logging_utils)
ROOT = "recipe.rolloutpipe"


class _TqdmHandler(logging.StreamHandler):
    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # logging's contract: a failing handler reports, never raises
            self.handleError(record)


def get_logger(name: str) -> logging.Logger:
    """The module's logger (``name``: its ``__name__``, or its dotted name when run as ``__main__``)."""
    root = logging.getLogger(ROOT)
    if not root.handlers:
        handler = _TqdmHandler()
        handler.setFormatter(logging.Formatter(FORMAT))
        root.addHandler(handler)
        root.setLevel(os.getenv("ROLLOUTPIPE_LOGGING_LEVEL", "INFO"))
        root.propagate = False  # verl and Ray configure the root logger their own way
    return logging.getLogger(name if name.startswith(ROOT) else f"{ROOT}.{name}")
