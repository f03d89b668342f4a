"""The stage tests' shared fixtures, registered here once so that each session fixture
is built once per run (they are defined beside their helpers)."""

from tests.stages.augment_fixtures import copy_marian, corpus, model_copy, tiny_marian  # noqa: F401
from tests.stages.mining_fixtures import mining_inputs, tiny_bert  # noqa: F401
