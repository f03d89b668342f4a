"""One declaration per setting: each stage's pydantic config declares its keys, validation and
defaults. Sample's draws and mine's index read the frozen config itself; the views that remain
hold what the config does not (the train loop's TrainSettings: the objective's recipe resolved;
pretrain's PretrainSettings: the steps resolved, and the fields its record holds;
backtranslate's NoiseSettings: the words and the route's seed; rewrite's ChatSettings: what the
client may send, never a key). They declare no default and take every other field from the
config by name; a train recipe's keys are the TrainConfig fields marked RECIPE, with
TrainConfig's validation."""

from __future__ import annotations

import dataclasses

import pytest
from pairforge.pipeline.plumbing.config import validate_section
from pairforge.pipeline.plumbing.errors import ConfigError
from pairforge.stages.backtranslate.noise import NoiseSettings
from pairforge.stages.backtranslate.stage import NoiseConfig
from pairforge.stages.pretrain.infocse import PretrainSettings
from pairforge.stages.pretrain.stage import PretrainConfig
from pairforge.stages.rewrite.llm import ChatSettings
from pairforge.stages.rewrite.stage import RewriteConfig
from pairforge.stages.train import stage as T
from pairforge.train.loop import TrainSettings

# view -> (its config, the fields the caller resolves instead of copying)
VIEWS = {
    TrainSettings: (T.TrainConfig, {"options"}),
    PretrainSettings: (PretrainConfig, set()),
    NoiseSettings: (NoiseConfig, {"vocabulary", "seed"}),
    ChatSettings: (RewriteConfig, set()),
}


@pytest.mark.parametrize("view", list(VIEWS), ids=lambda v: v.__name__)
def test_views_declare_no_default_and_only_config_keys(view):
    config, resolved = VIEWS[view]
    assert dataclasses.is_dataclass(view) and view.__dataclass_params__.frozen
    for field in dataclasses.fields(view):
        assert field.default is dataclasses.MISSING, f"{view.__name__}.{field.name} has a default"
        assert field.default_factory is dataclasses.MISSING, f"{view.__name__}.{field.name}"
        if field.name not in resolved:
            assert field.name in config.model_fields, f"{view.__name__}.{field.name}"


def test_views_built_from_a_config_carry_its_values():
    pretrain = PretrainSettings.of(PretrainConfig(steps=0, lower_layers=3), steps=17)
    assert (pretrain.steps, pretrain.lower_layers, pretrain.mask_rate) == (17, 3, 0.15)
    noise = NoiseSettings.of(NoiseConfig(copies=3, kinds=["mask"]), ["the", "of"], seed=4)
    assert (noise.copies, noise.kinds, noise.vocabulary, noise.seed) == (
        3,
        ("mask",),
        ("the", "of"),
        4,
    )
    chat = ChatSettings.of(RewriteConfig(model="m", temperature=0.3, api_key_env="KEY_VAR"))
    assert (chat.model, chat.temperature, chat.api_key_env) == ("m", 0.3, "KEY_VAR")


def test_train_settings_take_the_configs_values_not_defaults_of_their_own():
    # params.yaml's lr (2.5e-5) once met a loop default of 3e-5; now the config is the only source.
    cfg = T.TrainConfig(lr=2.5e-5, eval_tasks=["demo_dev"], max_grad_norm=0.0, threads=2)
    settings = T.settings_for(cfg)
    assert (settings.lr, settings.eval_tasks, settings.threads) == (2.5e-5, ("demo_dev",), 2)
    assert settings.max_grad_norm is None  # 0 in the config: no clipping
    assert settings.options == {} and settings.objective == "simcse"
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.lr = 1.0  # type: ignore[misc]


def test_recipe_keys_are_the_train_fields_marked_recipe():
    marked = [name for name, f in T.TrainConfig.model_fields.items() if T.RECIPE in f.metadata]
    assert list(T.RECIPE_KEYS) == marked
    assert list(T.RecipeConfig.model_fields) == [*marked, "options"]
    assert {"lr", "batch_size", "max_steps", "eval_tasks"} <= set(T.RECIPE_KEYS)
    assert not {"model", "seed", "precision", "recipes"} & set(T.RECIPE_KEYS)
    recipe = T.RecipeConfig()
    assert all(getattr(recipe, key) is None for key in T.RECIPE_KEYS) and recipe.options == {}


@pytest.mark.parametrize(
    ("key", "bad"),
    [
        ("lr", 0),
        ("batch_size", 0),
        ("warmup_ratio", 1.5),
        ("schedule", "cosine"),
        ("eval_tasks", []),
    ],
)
def test_a_recipe_key_is_validated_as_the_shared_key_is(key, bad):
    with pytest.raises(ConfigError, match=rf"^train\.{key}\b"):
        validate_section("train", T.TrainConfig, {key: bad})
    with pytest.raises(ConfigError, match=rf"^train\.recipes\.bsl\.{key}\b"):
        validate_section("train", T.TrainConfig, {"recipes": {"bsl": {key: bad}}})


def test_a_misspelt_recipe_key_names_itself():
    with pytest.raises(ConfigError, match=r"train\.recipes\.bsl\.learning_rate"):
        validate_section("train", T.TrainConfig, {"recipes": {"bsl": {"learning_rate": 1e-4}}})
