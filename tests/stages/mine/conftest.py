"""The autouse fixtures of ``tests/stages/mining_fixtures.py`` for the tests of this folder."""

from tests.stages.mining_fixtures import one_torch_thread  # noqa: F401
