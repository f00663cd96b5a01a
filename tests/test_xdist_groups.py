"""The pytest-xdist groups of ``tests/conftest.py`` are in effect (they fail silently otherwise:
pytest-xdist 3.8 under pytest 9 drops them and scatters module fixtures over the workers)."""

import os

import pytest


@pytest.mark.skipif("PYTEST_XDIST_WORKER" not in os.environ, reason="run without pytest-xdist (-n 0)")
def test_this_test_runs_in_its_file_group(request: pytest.FixtureRequest) -> None:
    assert request.node.nodeid.endswith("@test_xdist_groups.py"), request.node.nodeid
