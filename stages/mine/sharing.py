"""The ``mine`` stage's index as its Dask workers read it: written once by the driver to
``<output>/_work`` (atomically), copied into the store when the output is remote, and fetched once
by each worker that shares no filesystem with the driver."""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pairforge.pipeline.plumbing.integrity import shard_cache
from pairforge.pipeline.plumbing.storage import RemotePath, dataset_path
from pairforge.pipeline.science.mining_inputs import VECTOR_FILE

if TYPE_CHECKING:
    from pairforge.stages.mine.stage import MineConfig

SEARCH_FILE = "search.faiss"  # the index as the Dask workers read it, in <output>/_work


def write_search_index(index, path: Path) -> None:
    """The index, on the CPU, where the Dask workers read it (atomically: a worker never reads
    half a file)."""
    import faiss
    from pairforge.stages.mine.ondisk import is_mapped
    from pairforge.stages.mine.searcher import INDEX_FILE, _on_gpu
    from pairforge.stages.mine.torch_search import TorchFlatIndex

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    if is_mapped(index):
        # Its lists are mapped from <output>/_work/index.faiss, which faiss wrote: the workers
        # map the same file (a link; faiss cannot write an index whose lists it mapped).
        tmp.unlink(missing_ok=True)
        try:
            os.link(path.with_name(INDEX_FILE), tmp)
        except OSError:  # a filesystem without hard links
            shutil.copyfile(path.with_name(INDEX_FILE), tmp)
    elif isinstance(index, TorchFlatIndex):
        # The workers search on the CPU with faiss's exact index of the same vectors: the same
        # neighbours up to exact ties (tests/stages/mine/test_torch_search.py).
        flat = faiss.IndexFlatIP(index.d)
        flat.add(index.corpus.cpu().numpy())
        faiss.write_index(flat, str(tmp))
    else:
        faiss.write_index(faiss.index_gpu_to_cpu(index) if _on_gpu(index) else index, str(tmp))
    tmp.replace(path)


def share_index(cfg: MineConfig, index_path: Path, index: Any) -> str:
    """Where the Dask workers read the saved index: the local file when the output is local
    (the workers share its filesystem), else copies in the store under ``<output>/_work`` (the
    index and, beside it, the spilled vectors a non-flat index searches with), so that workers
    that share no filesystem with this process fetch them (:func:`fetch_index`)."""
    output = dataset_path(cfg.output)
    if not isinstance(output, RemotePath):
        return str(index_path)
    import faiss
    from pairforge.stages.mine.torch_search import TorchFlatIndex

    shared = output / "_work"
    flat = isinstance(index, (faiss.IndexFlat, TorchFlatIndex))  # searched on its own vectors
    for name in (SEARCH_FILE,) if flat else (VECTOR_FILE, SEARCH_FILE):
        (shared / name).upload(index_path.parent / name)
    return str(shared / SEARCH_FILE)


def fetch_index(url: str, key: str) -> str:
    """A worker's local copy of the index the driver put in the store (and of the vectors beside
    it), in the local cache under the run's key; earlier runs' copies there are removed."""
    folder = shard_cache().parent / "mine-index"
    here = folder / hashlib.sha256(f"{url}|{key}".encode()).hexdigest()[:16]
    shared = dataset_path(url).parent
    if not (here / SEARCH_FILE).is_file():
        if folder.is_dir():  # the workers of a machine share it: each copies under its own name
            for old in folder.iterdir():
                if old != here:
                    shutil.rmtree(old, ignore_errors=True)
        here.mkdir(parents=True, exist_ok=True)
        if (shared / VECTOR_FILE).exists():
            (shared / VECTOR_FILE).download(here / VECTOR_FILE)
        (shared / SEARCH_FILE).download(here / SEARCH_FILE)  # last: its presence means done
    return str(here / SEARCH_FILE)
