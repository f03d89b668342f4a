"""The torch-free option declarations (train/objective_options.py) agree with the objectives."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.train.objective_options import OPTIONS, check_options
from pairforge.train.objectives import OBJECTIVES
from pairforge.train.objectives.base import BuildContext


def provided_by_the_trainer() -> set[str]:
    """Constructor arguments the trainer fills itself (never options)."""
    encoder = SimpleNamespace(config=SimpleNamespace(hidden_size=8, vocab_size=10))
    tokenizer = SimpleNamespace(mask_token_id=1, pad_token_id=0)
    return set(BuildContext(encoder, tokenizer, mlm_head=object()).arguments())


def test_every_objective_declares_its_options_and_nothing_else():
    assert set(OPTIONS) == set(OBJECTIVES)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_options_are_the_constructor_arguments_with_its_defaults(name):
    parameters = inspect.signature(OBJECTIVES[name].__init__).parameters
    arguments = {
        key: p.default
        for key, p in parameters.items()
        if key != "self" and key not in provided_by_the_trainer()
    }
    declared = OPTIONS[name].model_fields
    assert set(declared) == set(arguments), (
        f"{name}: declare each constructor option in train/objective_options.py"
    )
    for key, field in declared.items():
        default = arguments[key]
        assert default is not inspect.Parameter.empty, f"{name}.{key} has no default"
        assert field.default == default, f"{name}.{key}: {field.default!r} != {default!r}"


def test_check_options_names_the_key_and_the_accepted_options():
    assert check_options("bsl", {"k": 2}, "k").k == 2
    with pytest.raises(ConfigError) as error:
        check_options("simcse", {"temprature": 0.1}, "train.recipes.simcse.options")
    assert str(error.value) == (
        "train.recipes.simcse.options: unknown option 'temprature' (accepted: temperature, pooling)"
    )
    with pytest.raises(ConfigError, match=r"options.pooling: 'mask' is not allowed"):
        check_options("debcse", {"pooling": "mask"}, "options")
    with pytest.raises(ConfigError, match=r"^options.templates: 3 is not allowed; allowed values"):
        check_options("cotbert", {"templates": 3}, "options")
    # Values are passed to the constructor unchanged, so none is converted here either.
    with pytest.raises(ConfigError, match=r"^options.temperature: '0.1' is invalid"):
        check_options("simcse", {"temperature": "0.1"}, "options")
    with pytest.raises(ConfigError, match=r"^options.denoise: 1 is invalid"):
        check_options("cotbert", {"denoise": 1}, "options")
    assert check_options("simcse", {"temperature": 1}, "options").temperature == 1.0
