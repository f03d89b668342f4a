"""Write data/demo/bad.txt: a deliberately broken text file for the ingest quarantine.

Run with plain ``python3 data/demo/make_bad.py``; it writes ``bad.txt`` next to this
script. Output is byte-for-byte deterministic (no randomness, no timestamps).

The file starts with a UTF-8 BOM (EF BB BF) glued to line 1 and uses MIXED line
endings: CRLF, LF, and three lone CR terminators (after lines 2, 5 and 17; each of
those is followed by a non-newline byte, so no accidental CRLF is formed). Every
line, including the last, is terminated.

Line-by-line content (line numbers as seen by a universal-newline reader, i.e.
Python ``bytes.splitlines()`` or ``open(..., newline=None)``):

  line  kind            terminator  content
  ----  --------------  ----------  ---------------------------------------------------
     1  good            CRLF        BOM + "The lighthouse keeper climbed the spiral stairs every evening to light the lamp."
     2  good            CR          "Our allotment produced more courgettes this year than the whole street could eat."
     3  good            LF          "A small bookshop near the station sells second-hand atlases and old maps."
     4  good            CRLF        "The choir rehearses in the village hall on Wednesday evenings from seven until nine."
     5  good            CR          "Sea kayaking is easiest in the early morning before the wind picks up."
     6  good            LF          "The new footbridge connects the university campus with the botanical garden across the river."
     7  invalid_utf8    CRLF        Latin-1 byte: b"caf\\xe9 au lait is served warm every morning in the station buffet"
     8  invalid_utf8    LF          truncated 3-byte sequence mid-line: b"The ticket cost twenty \\xe2\\x82 at the little cinema on the square"
     9  invalid_utf8    LF          lone continuation bytes + truncated lead byte at end:
                                    b"Our guide \\x80\\xbf showed us the old harbour and the cr\\xc3"
    10  nul             CRLF        b"The library opens at nine\\x00 on weekday mornings and closes at eight."
    11  nul             LF          b"Fresh bread is delivered to the corner shop\\x00 before six every day."
    12  empty           LF          b""
    13  empty           CRLF        b""
    14  empty           LF          b""
    15  whitespace      LF          b"   \\t  "  (spaces and a tab)
    16  whitespace      CRLF        b"\\t\\t "  (tabs and a space)
    17  too_short       CR          "Hello."        (1 word)
    18  too_short       LF          "Yes indeed"    (2 words)
    19  too_short       LF          "Thanks!"       (1 word)
    20  overlong        LF          "rain falls on the hills" repeated 600 times, then "."
                                    (3,000 words, 14,400 bytes, ASCII)
    21  control_char    CRLF        b"The bell rang\\x07 twice before the first class began this morning."
                                    (BEL; 11 words once the control char is removed)
    22  control_char    LF          b"Press the escape\\x1b key to cancel the print job on the old office printer."
                                    (ESC; 14 words once the control char is removed)
    23  duplicate       LF          exact copy of line 2
    24  duplicate       CRLF        exact copy of line 4

Expected counts:
  lines total (universal newlines: CR, LF, CRLF)  24
  lines if split on LF only                       21  (lines 2+3, 5+6, 17+18 merge)
  good sentences (lines 1-6)                       6
  invalid UTF-8 lines (7-9)                        3
  lines containing NUL (10-11)                     2
  empty lines (12-14)                              3
  whitespace-only lines (15-16)                    2
  too-short lines, 1-2 words (17-19)               3
  overlong line, ~3,000 words (20)                 1
  control-character lines (21-22)                  2  -> should survive normalisation as good
  exact duplicates of good lines (23-24)           2
  line terminators: CRLF 8, LF 13, lone CR 3

So a correct ingest keeps 8 unique good sentences (lines 1-6, 21, 22; line 1 only
after stripping the BOM), drops 2 duplicates, and quarantines or drops
3 + 2 + 3 + 2 + 3 + 1 = 14 bad lines. Control characters used are only BEL (0x07)
and ESC (0x1B); none of 0x0B, 0x0C, 0x1C-0x1E, 0x85, U+2028/2029 appear, so
``str.splitlines()`` and ``bytes.splitlines()`` agree on 24 lines for the valid parts.
"""

from pathlib import Path

CRLF, LF, CR = b"\r\n", b"\n", b"\r"
BOM = b"\xef\xbb\xbf"

GOOD = [
    b"The lighthouse keeper climbed the spiral stairs every evening to light the lamp.",
    b"Our allotment produced more courgettes this year than the whole street could eat.",
    b"A small bookshop near the station sells second-hand atlases and old maps.",
    b"The choir rehearses in the village hall on Wednesday evenings from seven until nine.",
    b"Sea kayaking is easiest in the early morning before the wind picks up.",
    b"The new footbridge connects the university campus with the botanical garden across the river.",
]

# (kind, content bytes, terminator) in file order
LINES = [
    ("good", BOM + GOOD[0], CRLF),
    ("good", GOOD[1], CR),
    ("good", GOOD[2], LF),
    ("good", GOOD[3], CRLF),
    ("good", GOOD[4], CR),
    ("good", GOOD[5], LF),
    ("invalid_utf8", b"caf\xe9 au lait is served warm every morning in the station buffet", CRLF),
    ("invalid_utf8", b"The ticket cost twenty \xe2\x82 at the little cinema on the square", LF),
    ("invalid_utf8", b"Our guide \x80\xbf showed us the old harbour and the cr\xc3", LF),
    ("nul", b"The library opens at nine\x00 on weekday mornings and closes at eight.", CRLF),
    ("nul", b"Fresh bread is delivered to the corner shop\x00 before six every day.", LF),
    ("empty", b"", LF),
    ("empty", b"", CRLF),
    ("empty", b"", LF),
    ("whitespace", b"   \t  ", LF),
    ("whitespace", b"\t\t ", CRLF),
    ("too_short", b"Hello.", CR),
    ("too_short", b"Yes indeed", LF),
    ("too_short", b"Thanks!", LF),
    ("overlong", b" ".join([b"rain falls on the hills"] * 600) + b".", LF),
    ("control_char", b"The bell rang\x07 twice before the first class began this morning.", CRLF),
    (
        "control_char",
        b"Press the escape\x1b key to cancel the print job on the old office printer.",
        LF,
    ),
    ("duplicate", GOOD[1], LF),
    ("duplicate", GOOD[3], CRLF),
]

EXPECTED = {
    "lines_total": 24,
    "lines_lf_only": 21,
    "good": 6,
    "invalid_utf8": 3,
    "nul": 2,
    "empty": 3,
    "whitespace": 2,
    "too_short": 3,
    "overlong": 1,
    "control_char": 2,
    "duplicate": 2,
}


def build() -> bytes:
    return b"".join(content + term for _, content, term in LINES)


def main() -> None:
    data = build()
    # self-checks, so the docstring and the bytes cannot drift apart
    assert len(LINES) == EXPECTED["lines_total"]
    assert len(data.splitlines()) == EXPECTED["lines_total"]
    assert data.count(b"\n") == EXPECTED["lines_lf_only"]
    for kind, n in EXPECTED.items():
        if not kind.startswith("lines"):
            assert sum(k == kind for k, _, _ in LINES) == n, kind
    assert data.startswith(BOM)
    assert len(LINES[19][1].split()) == 3000
    out = Path(__file__).resolve().with_name("bad.txt")
    out.write_bytes(data)
    print(f"wrote {out} ({len(data)} bytes, {len(LINES)} lines)")


if __name__ == "__main__":
    main()
