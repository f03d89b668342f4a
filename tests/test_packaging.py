"""The wheel holds every package of the source tree: pyproject.toml lists each one by name
(its folders are installed under ``pairforge.``), so a new stage's package left out of the list
would be missing from a wheel install while an editable one still finds it."""

from __future__ import annotations

import fnmatch
import re

from tests.conftest import ROOT


def test_pyproject_lists_every_package_of_the_source_tree():
    # Read with patterns: tomllib is Python 3.11+, and the project runs on 3.10.
    text = (ROOT / "pyproject.toml").read_text()
    mapping = re.search(r"^package-dir = \{(.*)\}$", text, re.M).group(1)
    folders = {p: ROOT / f for p, f in re.findall(r'"([\w.]+)" = "([\w/]+)"', mapping)}
    listed = re.findall(
        r'^    "(pairforge[\w.]*)",$',
        re.search(r"^packages = \[(.*?)^\]", text, re.M | re.S).group(1),
        re.M,
    )
    assert len(folders) == 4 and len(listed) > 10
    # The one data package (no __init__): the demo data `pairforge init` copies, each file of it
    # matched by the package data's patterns.
    found = {"pairforge.demo"}
    from pairforge.stages.init import DEMO_FILES

    data = re.search(r'^"pairforge\.demo" = \[(.*)\]$', text, re.M).group(1)
    patterns = re.findall(r'"([^"]+)"', data)
    for name in DEMO_FILES:
        assert (folders["pairforge.demo"] / name).is_file(), name
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name
    for package, folder in folders.items():
        for init in folder.rglob("__init__.py"):
            if "__pycache__" not in init.parts:
                parts = init.parent.relative_to(folder).parts
                found.add(".".join([package, *parts]))
    assert set(listed) == found
