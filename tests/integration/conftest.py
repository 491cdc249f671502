import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TRAINQ = Path(os.environ.get("TRAINQ_BIN", REPO / "build" / "trainq"))


@pytest.fixture(scope="session")
def trainq():
    if not (TRAINQ.is_file() and os.access(TRAINQ, os.X_OK)):
        pytest.skip("%s is missing: build it first (make)" % TRAINQ)
    return str(TRAINQ)
