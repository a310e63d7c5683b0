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


@pytest.fixture(scope="session", autouse=True)
def no_prepared_copies_left_in_the_users_cache():
    """A test that loads a model of its own at low bit prepares its copy in a folder of its own
    (SPECCHAT_CACHE): only the default pair's copies, which the real-model tests prepare once, may
    join the user's cache."""
    from app.engine.models import defaults as default_models, prepared_copies as prepared

    before = {copy.path.name for copy in prepared.copies()}
    yield
    defaults = tuple(packaged.name for packaged in default_models.DEFAULTS.values())
    left = [c.path.name for c in prepared.copies() if c.path.name not in before and not c.path.name.startswith(defaults)]
    assert not left, f"tests left prepared copies in {prepared.folder()}: {left}"
