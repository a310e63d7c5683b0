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


@pytest.fixture(autouse=True)
def remembered_costs_in_tmp(tmp_path, monkeypatch):
    """Costs timed in a test are remembered in the test's own folder, not the user's cache."""
    monkeypatch.setattr("app.engine.calibration.costs_path", lambda: tmp_path / "costs.json")
