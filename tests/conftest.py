import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest

from tests.tiny import tiny_model


@pytest.fixture(scope="session")
def tiny_target():
    return tiny_model(seed=1)


@pytest.fixture(scope="session")
def tiny_draft():
    return tiny_model(seed=2)  # unrelated weights: almost nothing is accepted
