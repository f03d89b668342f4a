"""The autouse fixtures of ``tests/stages/mining_fixtures.py`` for the tests of this folder, and
``project``: a copied mining project with clustered sentence embeddings."""

import pytest

from tests.stages.mine.helpers import sentence_ids, vectors
from tests.stages.mining_fixtures import one_torch_thread  # noqa: F401
from tests.stages.mining_helpers import copy_project, write_embeddings


@pytest.fixture()
def project(mining_inputs, tmp_path):
    root = copy_project(mining_inputs, tmp_path)
    ids = sentence_ids(root)
    write_embeddings(root / "data/embeddings/sentences", ids, vectors(len(ids)), [40] * 6)
    return root
