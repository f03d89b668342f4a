"""The stand-in models' substitution table: word -> words that mean the same in (nearly) every
sentence, written by hand for the demo's stand-in translators (``stages.standin.marian``).

What goes in, and what stays out:

- **In**: synonyms whose meaning does not depend on the sentence ("large" -> "big", "began" ->
  "started", "purchased" -> "bought"), spelling variants ("colour" -> "color"), function-word
  variants ("amongst" -> "among", "although" -> "though", "almost" -> "nearly"), and number words
  as digits ("seven" -> "7"). An entry is one-directional where the other direction would break
  some sentences ("begin" -> "start" is safe, "start" -> "begin" is not: "a good start").
- **Out**: words whose swap breaks a construction ("needs to" -> "requires to", "children's"
  -> "kids's"); antonyms and co-hyponyms, which a word-embedding neighbour search proposes first and
  which change the meaning ("opened" -> "closed", "breakfast" -> "dinner", "Lisbon" -> "Dublin");
  words whose synonyms depend on the sense ("right", "close", "fair", "fall"); and pairs that
  change a following "a"/"an" (a vowel-initial word for a consonant-initial one or the reverse:
  "an expensive" must not become "an costly"), which :func:`substitutions` drops by rule.

A substitution can only happen where both words are single whole-word pieces of the stand-in's
vocabulary (the constructed model copies one piece per position), so the words of this table
that the corpus lacks simply never occur.
"""

from __future__ import annotations

from pathlib import Path

from pairforge.pipeline.plumbing.errors import ConfigError

# word: substitutes, best first. All lower case; capitalised forms are derived.
SYNONYMS: dict[str, tuple[str, ...]] = {
    # adjectives
    "large": ("big",),
    "big": ("large",),
    "largest": ("biggest",),
    "biggest": ("largest",),
    "huge": ("massive",),
    "massive": ("huge",),
    "tiny": ("minuscule",),
    "wealthy": ("rich",),
    "clever": ("smart",),
    "scared": ("frightened",),
    "frightened": ("scared",),
    "silent": ("quiet",),
    "entire": ("whole",),
    "unusual": ("uncommon",),
    "uncommon": ("unusual",),
    "difficult": ("tough",),
    "damp": ("moist",),
    "moist": ("damp",),
    "rapid": ("quick",),
    "quick": ("rapid",),
    "enormous": ("immense",),
    "immense": ("enormous",),
    "inexpensive": ("affordable",),
    # adverbs and function words
    "quickly": ("rapidly",),
    "rapidly": ("quickly",),
    "completely": ("entirely", "totally"),
    "entirely": ("completely",),
    "totally": ("completely",),
    "almost": ("nearly",),
    "nearly": ("almost",),
    "often": ("frequently",),
    "frequently": ("often",),
    "usually": ("normally", "generally"),
    "normally": ("usually",),
    "generally": ("usually",),
    "roughly": ("approximately",),
    "approximately": ("roughly",),
    "perhaps": ("maybe",),
    "maybe": ("perhaps",),
    "therefore": ("thus",),
    "thus": ("therefore",),
    "because": ("since",),
    "although": ("though",),
    "amongst": ("among",),
    "among": ("amongst",),
    "whilst": ("while",),
    "while": ("whilst",),
    "towards": ("toward",),
    "toward": ("towards",),
    "until": ("till",),
    "upon": ("on",),
    "extremely": ("exceptionally",),
    "immediately": ("instantly",),
    "instantly": ("immediately",),
    "slightly": ("somewhat",),
    "mostly": ("mainly",),
    "mainly": ("mostly",),
    # verbs (forms whose other senses are rare)
    "begin": ("start",),
    "began": ("started",),
    "begins": ("starts",),
    "starts": ("begins",),
    "purchased": ("bought",),
    "bought": ("purchased",),
    "buy": ("purchase",),
    "purchase": ("buy",),
    "closed": ("shut",),
    "ended": ("finished",),
    "halted": ("stopped",),
    "helped": ("assisted",),
    "assisted": ("helped",),
    "allowed": ("permitted",),
    "permitted": ("allowed",),
    "allows": ("permits",),
    "permits": ("allows",),
    "requires": ("needs",),
    "required": ("needed",),
    "built": ("constructed",),
    "constructed": ("built",),
    "repaired": ("fixed",),
    "received": ("got",),
    "answered": ("replied",),
    "replied": ("answered",),
    "answer": ("reply",),
    "reply": ("answer",),
    "chose": ("picked",),
    "ruined": ("spoiled",),
    "spoiled": ("ruined",),
    "damaged": ("harmed",),
    "wrecked": ("destroyed",),
    "destroyed": ("wrecked",),
    "said": ("stated",),
    "stayed": ("remained",),
    "remained": ("stayed",),
    "changed": ("altered",),
    "altered": ("changed",),
    "stated": ("said",),
    "attempted": ("tried",),
    # nouns
    "films": ("movies",),
    "movies": ("films",),
    "photographs": ("photos",),
    "photos": ("photographs",),
    "doctor": ("physician",),
    "physician": ("doctor",),
    "journey": ("trip",),
    "gift": ("present",),
    "noon": ("midday",),
    "midday": ("noon",),
    "rubbish": ("garbage",),
    "garbage": ("rubbish",),
    "students": ("pupils",),
    "pupils": ("students",),
    "mistakes": ("errors",),
    "errors": ("mistakes",),
    "fridge": ("refrigerator",),
    "refrigerator": ("fridge",),
    "holiday": ("vacation",),
    "bike": ("bicycle",),
    "bicycle": ("bike",),
    "bikes": ("bicycles",),
    "bicycles": ("bikes",),
    "phone": ("telephone",),
    "exam": ("examination",),
    "examination": ("exam",),
    "dawn": ("daybreak",),
    "daybreak": ("dawn",),
    "vacation": ("holiday",),
    # spelling variants
    "colour": ("color",),
    "color": ("colour",),
    "centre": ("center",),
    "center": ("centre",),
    "harbour": ("harbor",),
    "harbor": ("harbour",),
    "neighbours": ("neighbors",),
    "neighbors": ("neighbours",),
    "neighbour": ("neighbor",),
    "neighbor": ("neighbour",),
    "kilometres": ("kilometers",),
    "kilometers": ("kilometres",),
    "metres": ("meters",),
    "meters": ("metres",),
    "theatre": ("theater",),
    "theater": ("theatre",),
    "favourite": ("favorite",),
    "favorite": ("favourite",),
    "organised": ("organized",),
    "organized": ("organised",),
    "realised": ("realized",),
    "realized": ("realised",),
    "grey": ("gray",),
    "gray": ("grey",),
    # number words as digits (not "one": "no one", "the one"; not "twenty", "hundred", ...:
    # "twenty-five" and "a hundred" would become "20-five" and "a 100")
    "two": ("2",),
    "three": ("3",),
    "four": ("4",),
    "five": ("5",),
    "six": ("6",),
    "seven": ("7",),
    "nine": ("9",),
    "ten": ("10",),
    "eight": ("8",),
    "eleven": ("11",),
    "twelve": ("12",),
}


# Words no "a"/"an" comes straight before (verbs, conjunctions, prepositions, adverbs that
# modify verbs or clauses, plural nouns, and digits, which are read as their number word): the
# article rule below does not apply to them.
ARTICLE_FREE = frozenset(
    [
        "began",
        "begins",
        "starts",
        "purchased",
        "bought",
        "buy",
        "closed",
        "ended",
        "helped",
        "assisted",
        "allowed",
        "permitted",
        "allows",
        "permits",
        "needs",
        "requires",
        "needed",
        "required",
        "built",
        "constructed",
        "repaired",
        "received",
        "answered",
        "replied",
        "chose",
        "ruined",
        "spoiled",
        "damaged",
        "wrecked",
        "destroyed",
        "said",
        "stated",
        "stayed",
        "remained",
        "changed",
        "altered",
        "attempted",
        "because",
        "although",
        "amongst",
        "among",
        "whilst",
        "while",
        "towards",
        "toward",
        "until",
        "upon",
        "almost",
        "nearly",
        "often",
        "frequently",
        "usually",
        "normally",
        "generally",
        "perhaps",
        "maybe",
        "therefore",
        "thus",
        "quickly",
        "rapidly",
        "completely",
        "entirely",
        "totally",
        "immediately",
        "instantly",
        "mostly",
        "mainly",
        "slightly",
        "somewhat",
        "roughly",
        "approximately",
        "children",
        "kids",
        "films",
        "movies",
        "photographs",
        "photos",
        "students",
        "pupils",
        "mistakes",
        "errors",
        "neighbours",
        "neighbors",
        "kilometres",
        "kilometers",
        "metres",
        "meters",
        "bikes",
        "bicycles",
        "prices",
        "costs",
        "two",
        "three",
        "four",
        "five",
        "six",
        "seven",
        "eight",
        "nine",
        "ten",
        "eleven",
        "twelve",
    ]
)


def _vowel_sound(word: str) -> bool:
    # By letters, with the common "u" read as "you" (a usual, a university).
    w = word.lower()
    return w[:1] in "aeiou" and not w.startswith(("usu", "uni", "use", "eu"))


def substitutions(table: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    """The usable entries of ``table``: self-substitutions dropped, and, unless the word is in
    :data:`ARTICLE_FREE`, substitutes whose first sound changes between vowel and consonant
    dropped (they would break a preceding "a"/"an": "an expensive" -> "an costly")."""
    out = {}
    for word, subs in table.items():
        free = word in ARTICLE_FREE
        kept = tuple(
            s
            for s in subs
            if s != word and s.strip() and (free or _vowel_sound(s) == _vowel_sound(word))
        )
        if kept:
            out[word] = kept
    return out


def load_table(spec: str | None) -> dict[str, tuple[str, ...]]:
    """The table a ``standin.synonyms`` value names: ``builtin`` (:data:`SYNONYMS`), a path to a
    UTF-8 TSV file of ``word<TAB>substitute[<TAB>substitute...]`` lines (``#`` comments), or
    None (no substitutions: exact copies). Entries go through :func:`substitutions`."""
    if spec is None:
        return {}
    if spec == "builtin":
        return substitutions(SYNONYMS)
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(
            f"standin.synonyms: {spec!r} is neither 'builtin' nor a TSV file "
            "(word<TAB>substitute per line); set it to builtin, a file, or null for exact copies"
        )
    table: dict[str, tuple[str, ...]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        fields = [f.strip().lower() for f in line.split("\t")]
        if len(fields) < 2 or not all(fields) or any(" " in f for f in fields):
            raise ConfigError(
                f"standin.synonyms: {spec}:{number}: expected word<TAB>substitute (single words), "
                f"got {line!r}"
            )
        table[fields[0]] = (*table.get(fields[0], ()), *fields[1:])
    return substitutions(table)
