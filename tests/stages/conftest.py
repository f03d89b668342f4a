"""The stage tests' shared data fixture, registered here once so that it is built once per run
(it is defined beside its helpers; the tiny models are in ``tests/tiny_models.py``)."""

from tests.stages.mining_fixtures import mining_inputs  # noqa: F401
