"""The rewrite checks on their own: valid English passes the language check (capitalised words,
headline-like sentences without function words), other languages do not, a runaway answer is
``too_long`` before anything reads its words; and the log says what this run sent."""

from __future__ import annotations

import logging

import pytest
from pairforge.pipeline.plumbing.runner import LocalExecutor
from pairforge.stages.rewrite.llm import REASONS, Validation, validate_rewrite
from pairforge.stages.rewrite.stage import RewriteConfig, run

from tests.stages.augment_helpers import make_sentences, write_sentences
from tests.stages.rewrite.openai_server import RUNAWAY, FaultyChatServer
from tests.stages.rewrite.test_rewrite import KEY, settings

SOURCE = "The weather this summer has been unusually humid and hot in the city."

ENGLISH = [
    "Makes Humidity hot days feel even hotter.",  # quarantined before: no function word
    "Humidity makes hot days feel even hotter.",
    "Hot, sticky days feel hotter still when Humidity climbs.",
    "Summer Heat Waves Grow Longer Each Decade.",
    "Record Temperatures Hit Northern Cities Again.",
    "Muggy afternoons drain everyone's energy quickly.",
    "Paris Welcomes Millions Of Tourists Every Summer.",
    "Climate Scientists Warn About Rising Sea Levels.",
    "Thunderstorms often follow sweltering, humid afternoons.",
    "Damp air traps heat near the ground overnight.",
    "Sweat evaporates slowly when moisture saturates air.",
    "City Councils Open Cooling Centers During Heatwaves.",
    "Los Angeles suffered through another scorching week.",
    "Las Vegas Breaks Its All-Time Heat Record.",
    "El Niño usually brings warmer winters to Peru.",
    "Des Moines reported flooding after the storm.",
    "Dr. Smith recommends drinking water regularly.",
    "NASA satellites track ocean surface temperatures.",
    "Heat index values exceeded forty degrees Celsius.",
    "Fans circulate air but cannot lower humidity.",
    "Dehumidifiers remove moisture from indoor spaces efficiently.",
    "Tropical Storms Bring Heavy Rain And Strong Winds.",
    "Farmers Report Crop Losses After Prolonged Drought.",
    "Elderly residents face greater risks during heatwaves.",
    "Outdoor workers take frequent breaks under shade.",
    "Evening breezes rarely bring relief downtown.",
    "London Underground Trains Become Unbearably Warm.",
    "Humid Conditions Persist Across Southern States.",
    "Ice cream sales soar whenever temperatures spike.",
    "Air Conditioning Demand Strains Power Grids.",
    "Sleep quality drops sharply on humid nights.",
    "Cold showers offer brief comfort during heatwaves.",
    "Tokyo Olympics Faced Extreme Summer Temperatures.",
    "Mosquitoes thrive wherever stagnant water collects.",
    "Meteorologists predict relief arriving by Thursday.",
    "Sunscreen protects skin against harmful ultraviolet rays.",
    "Coastal towns enjoy milder temperatures than inland areas.",
    "It was so humid that the windows fogged up.",
    "The air felt thick, heavy and wet all day.",
    "We stayed inside because the heat was unbearable.",
    "Honestly, nobody enjoys weather like this.",
    "Rising dew points signal uncomfortable conditions ahead.",
    "Buenos Aires Tourists Seek Shade In Parks.",
    "Mount Everest Climbers Face Sudden Weather Changes.",
    "Berlin Zoo Animals Get Frozen Fruit Treats.",
    "San Francisco Fog Keeps Summers Surprisingly Cool.",
    "Amazon Rainforest Humidity Rarely Drops Below Eighty Percent.",
    "Quebec City hosted a winter carnival despite mild weather.",
    "Hurricane Season Officially Begins In June.",
    "Heatstroke symptoms include dizziness, nausea and confusion.",
    "Weather apps show feels-like temperatures too.",
]

OTHER_LANGUAGES = [
    "Le mer est calme aujourd'hui, vraiment très calme",
    "La chaleur humide rend les journées encore plus chaudes.",
    "Die Luftfeuchtigkeit macht heiße Tage noch heißer, und das ist nicht angenehm.",
    "Das Wetter ist heute sehr schwül und heiß.",
    "La humedad hace que los días calurosos sean aún más calurosos.",
    "El clima está muy húmedo y caluroso en la ciudad.",
    "L'umidità rende le giornate calde ancora più calde, non è vero che sono molto afose?",
    "A umidade torna os dias quentes ainda mais quentes, não é uma surpresa.",
    "De luchtvochtigheid maakt warme dagen nog warmer, dat is niet prettig voor een mens.",
    "湿度让炎热的日子感觉更热。",
    "湿気は暑い日をさらに暑く感じさせます。",
    "Влажность делает жаркие дни ещё жарче.",
    "Η υγρασία κάνει τις ζεστές μέρες ακόμα πιο ζεστές.",
]


def test_the_reasons_include_too_long():
    assert REASONS.index("too_long") < REASONS.index("wrong_language")


@pytest.mark.parametrize("answer", ENGLISH)
def test_valid_english_passes(answer):
    assert validate_rewrite(SOURCE, answer, Validation()) == (answer, None)


@pytest.mark.parametrize("answer", OTHER_LANGUAGES)
def test_other_languages_are_wrong_language(answer):
    assert validate_rewrite(SOURCE, answer, Validation())[1] == "wrong_language"


def test_a_1mb_answer_is_too_long_not_wrong_language():
    assert len(RUNAWAY.encode()) > 1_000_000
    assert validate_rewrite(SOURCE, RUNAWAY, Validation())[1] == "too_long"
    english = "Humidity makes hot days feel even hotter. " * 25_000
    assert validate_rewrite(SOURCE, english, Validation())[1] == "too_long"
    # Length limits are relative to the source; the short side keeps its reason.
    assert validate_rewrite(SOURCE, "Hot.", Validation())[1] == "bad_length"
    no_check = Validation(language=None)
    assert validate_rewrite(SOURCE, OTHER_LANGUAGES[3], no_check)[1] is None


def test_the_log_counts_the_requests_this_run_sent(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("PAIRFORGE_TEST_KEY", KEY)
    write_sentences(tmp_path / "sentences", make_sentences(24, seed=21), rows_per_shard=8)
    caplog.set_level(logging.INFO, logger="pairforge")
    with FaultyChatServer(seed=3) as server:
        cfg = RewriteConfig.model_validate(settings(tmp_path, server))
        first = run(cfg, LocalExecutor(), progress=False)
        sent = server.requests
        assert sent == first["requests_sent"] == 24
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rewrite:")]
        assert "this run: 24 requests sent, 0 cache hits" in lines[-1]
        caplog.clear()
        again = run(cfg, LocalExecutor(), progress=False)  # the same, finished datasets
        assert server.requests == sent  # nothing sent
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rewrite:")]
        assert "this run: 0 requests sent, 0 cache hits" in lines[-1]
        assert "the datasets: 24 requests" in lines[-1]
        assert again == first  # the metrics describe the datasets, not the run
