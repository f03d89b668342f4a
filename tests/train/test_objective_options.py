"""The options of each objective, read from its constructor without torch (train/objective_options.py)."""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.train.objective_options import PROVIDED, check_options, objective_options
from pairforge.train.objectives import OBJECTIVES
from pairforge.train.objectives.base import BuildContext


def test_the_trainer_provides_exactly_what_is_never_an_option():
    encoder = SimpleNamespace(config=SimpleNamespace(hidden_size=8, vocab_size=10))
    tokenizer = SimpleNamespace(mask_token_id=1, pad_token_id=0)
    assert set(BuildContext(encoder, tokenizer, mlm_head=object()).arguments()) == PROVIDED


def test_every_objective_has_its_options_read_from_its_constructor():
    assert set(objective_options()) == set(OBJECTIVES)


@pytest.mark.parametrize("name", sorted(OBJECTIVES))
def test_the_options_read_from_the_source_are_the_constructors_arguments(name):
    """What the source says (read without torch) is what the imported constructor takes: every
    argument the trainer does not provide, with its default, in its order."""
    parameters = inspect.signature(OBJECTIVES[name].__init__).parameters
    arguments = {
        key: p.default for key, p in parameters.items() if key != "self" and key not in PROVIDED
    }
    fields = objective_options()[name].model_fields
    assert list(fields) == list(arguments), name
    for key, field in fields.items():
        assert field.default == arguments[key], f"{name}.{key}: {field.default!r}"


def test_a_constructor_bound_is_an_option_bound():
    """The types in the constructors carry their bounds: a temperature must be above 0, a
    dropout below 1, a count at least 1."""
    with pytest.raises(ConfigError, match=r"options.temperature"):
        check_options("debcse", {"temperature": 0.0}, "options")
    with pytest.raises(ConfigError, match=r"options.noise_dropout"):
        check_options("denosent", {"noise_dropout": 1.0}, "options")
    with pytest.raises(ConfigError, match=r"options.k"):
        check_options("bsl", {"k": 0}, "options")
    assert check_options("infocse", {"lower_layers": None}, "options").lower_layers is None
    assert check_options("cotbert", {"templates": ["a [X] b [MASK]"]}, "options").templates


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
