"""Finding the final answer in a model completion, under a named extraction policy (`answer_format`).

Reasoning inside `<think>...</think>` never counts, nor does a chat turn that follows the answer
(`<|im_start|>user ...`). Outside it, the answer is, in order of preference:
1. the last `\\boxed{}` / `\\fbox{}` or the Minerva sentence "The final answer is X. I hope it is
   correct.", whichever comes last;
2. an explicit answer statement: an "Answer: X" line, "the answer is X", X under a "**Final Answer**"
   heading, or GSM8K's `#### X`;
3. a bare final line that is all math (`-5`, `\\frac{3}{4}`, `1,000.99`), else the last math span or
   number of the final statement (`... so the probability is 2/3.`).

The policy says how far down that list a completion may go:
- `boxed` (the default): 1, or 2 only on the last non-empty line: the line is `#### X`, starts with
  "Answer:" / "Final answer:" (markdown emphasis allowed), ends with the sentence "the (final) answer
  is X", or is X right under a "Final Answer" heading; X is read as stated (math, or what follows
  its last "is"), never as the last number of a sentence. Nothing else counts, so noise that
  happens to hold a number ("blah is 5 blah", "Numbers: 3, 9, 5", "#### of 54 value y") has no
  answer.
- `lenient`: 1, 2 anywhere near the end, then 3.
All but the boxes are looked for near the end of the completion (the last `TAIL_CHARS` characters).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Answer phrases and math spans are looked for in the last TAIL_CHARS characters only, and boxes
# are matched in one pass, so degenerate completions (megabytes of repeated "the answer is", "$$"
# or "\\boxed{") cost linear time.
TAIL_CHARS = 4000
BOXED, LENIENT = "boxed", "lenient"
ANSWER_FORMATS = (BOXED, LENIENT)
DEFAULT_ANSWER_FORMAT = BOXED  # a random-weight model must earn nothing: training uses the strict policy
_THINK_TAG = re.compile(r"<(/?)think(?:ing)?>", re.IGNORECASE)
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)\s*")
_BOX_TOKEN = re.compile(r"[^\s$]+")
_MINERVA = re.compile(
    r"final answer is\s*:?\s*(.{1,500}?)\.?\s*I hope it is correct", re.IGNORECASE | re.DOTALL
)
_ANSWER_LINE = re.compile(
    r"(?:^|(?<=[.!?]\s))[\s>#*_-]*(?:final\s+)?answer\s*(?:\*\*|__)?\s*[:：]\s*(?:\*\*|__)?(.{1,500}?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_ANSWER_HEADING = re.compile(
    r"^[\s>#*_-]*final\s+answer[\s*_]*:?[\s*_]*\n\s*(.{1,500}?)\s*$", re.IGNORECASE | re.MULTILINE
)
_GSM8K_MARKER = re.compile(r"^\s*####\s*(.{1,500}?)\s*$", re.MULTILINE)
_ANSWER_PHRASE = re.compile(
    r"\bthe\s+(?:final\s+)?answer\s+is\s*:?\s*(.{1,500}?)(?:\.(?=\s|$)|\n|$)", re.IGNORECASE
)
_MATH_SPAN = re.compile(
    r"\$\$(?P<a>.{1,2000}?)\$\$|\\\[(?P<b>.{1,2000}?)\\\]|\\\((?P<c>[^\n]{1,2000}?)\\\)"
    r"|(?<![\\$])\$(?P<d>[^$\n]{1,2000}?)(?<!\\)\$",
    re.DOTALL,
)
_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_CONNECTOR_ONLY = re.compile(r"^(?:[\s,;.\"'`\\]|\bor\b|\band\b)*$", re.IGNORECASE)
_CHAT_TURN = re.compile(r"<\|(?:im_start|im_end|endoftext|eot_id|start_header_id)\|>")
_HOPE = re.compile(r"\.?\s*I hope it is correct", re.IGNORECASE)
_COPULA = re.compile(r"\s(?:is|are|equals|was|be)\s+(?:about\s+|exactly\s+|equal\s+to\s+)?", re.IGNORECASE)
# A number as prose writes it: `-5`, `.4`, `1,000.99`, `2,74`, `2/3`, `\frac{1}{2}`, `28%`; not a
# digit inside a word (`AZYUK2A`). Units may follow (`1,000.99m²`).
_NUMBER_TOKEN = re.compile(
    r"(?<![\w.\\^_])[-−]?(?:\\[dt]?frac\{\d+\}\{\d+\}|\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+,\d+(?![\d,])|\d*\.?\d+(?:/\d+)?)(?:\s?(?:\\?%|percent\b|pct\b))?(?!\d)"
)
# A statement that concludes: "... is 2/3", "there are 12 ...", "Therefore ... 100%", "Total: 42".
_CONCLUSION = re.compile(
    r"\b(?:is|are|was|were|equals?|therefore|thus|hence|so|get|gets|got|gives?|obtain|makes?|it's|altogether|total)\b|[:=]",
    re.IGNORECASE,
)
_SENTENCE_END = re.compile(r"[.!?](?:\s|$)|\n")
# Inline math broken over lines (`$ \n 9 \n $`, `\( \n 9 \n \)`) is not read as an answer.
_BROKEN_MATH = re.compile(r"(?<!\\)\$[^$]*\n[^$]*(?<!\\)\$|\\\(.*?\\\)", re.DOTALL)
_DELIMITER_CHARS = re.compile(r"\$|\\[()\[\]]")
_TEXT_ARGUMENT = re.compile(r"\\(?:text|mathrm|textbf|mbox|operatorname|begin|end)\s*\{[^{}]*\}")
_COMMAND = re.compile(r"\\[a-zA-Z]+")
_WORD = re.compile(r"[A-Za-z]{3,}")
GLUED_OR = re.compile(r"(?<=[\d)\]}])or(?=[A-Z(\[\\\d-])")  # `(11,7)or(7,11)`: spaces stripped


@dataclass(frozen=True)
class Extraction:
    """The answer found in a completion.

    `answer` is the answer text (None when none was found), `method` says where it came from
    (`boxed`, `final_answer`, `answer_line`, `math_span` or `none`), and `boxed` lists every boxed
    answer outside reasoning blocks in order, for spotting several different boxed answers.
    """

    answer: str | None
    method: str
    boxed: tuple[str, ...] = field(default=())


def strip_reasoning(text: str) -> str:
    """The completion without its reasoning: closed think blocks are removed, text before an orphan
    `</think>` is dropped, and everything after an unclosed `<think>` is dropped."""
    kept: list[str] = []
    inside = False
    start = 0
    for tag in _THINK_TAG.finditer(text):
        closing = tag.group(1) == "/"
        if not closing and not inside:
            kept.append(text[start : tag.start()])
            inside = True
        elif closing:
            if not inside:  # an orphan close: everything so far was reasoning
                kept.clear()
            inside = False
            start = tag.end()
    if not inside:
        kept.append(text[start:])
    return " ".join(kept)


def find_boxed(text: str) -> list[str]:
    """The contents of every complete `\\boxed{...}` / `\\fbox{...}` in `text`, in order.

    Braces are matched with escaped braces (`\\{`, `\\}`) skipped; a box cut off by the end of the
    text is ignored. `\\boxed 5` (no braces) yields its single token.
    """
    return [box.content for box in boxed_spans(text)]


@dataclass(frozen=True)
class Box:
    """One boxed answer: its content and where the whole `\\boxed{...}` starts and ends in the text."""

    content: str
    start: int
    end: int


def boxed_spans(text: str) -> list[Box]:
    """Every complete box of `text` with its position (see `find_boxed`)."""
    closes = _closing_braces(text)
    found = []
    for match in _BOX_COMMAND.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            if start in closes:
                found.append(Box(text[start + 1 : closes[start]].strip(), match.start(), closes[start] + 1))
        elif match.group(0)[-1:].isspace():
            token = _BOX_TOKEN.match(text, start)
            if token:
                found.append(Box(token.group(0).rstrip(".,"), match.start(), token.end()))
    return found


def _closing_braces(text: str) -> dict[int, int]:
    """For each `{` in `text` that is closed, the index of its `}` (one linear pass; `\\{` and
    `\\}` are escaped braces, not groups)."""
    closes: dict[int, int] = {}
    stack: list[int] = []
    i = 0
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            stack.append(i)
        elif char == "}" and stack:
            closes[stack.pop()] = i
        i += 1
    return closes


def extract_answer(completion: str, answer_format: str = DEFAULT_ANSWER_FORMAT) -> Extraction:
    """Find the final answer of `completion` under `answer_format` (see the module docstring)."""
    if answer_format not in ANSWER_FORMATS:
        raise ValueError(f"answer_format must be one of {', '.join(ANSWER_FORMATS)}, not {answer_format!r}")
    text = _CHAT_TURN.split(strip_reasoning(completion), maxsplit=1)[0]
    boxes = boxed_spans(text)
    boxed = tuple(box.content for box in boxes)
    tail_start = max(0, len(text) - TAIL_CHARS)
    tail = text[tail_start:]
    minerva = _last_match(_MINERVA, tail)
    if minerva is not None and (not boxes or minerva.start() + tail_start >= boxes[-1].end):
        return Extraction(clean_answer_text(minerva.group(1)), "final_answer")  # earlier boxes were drafts
    if boxes:
        return Extraction(boxed[-1], "boxed", boxed)
    if answer_format == BOXED:
        stated = _final_answer_line(tail)  # read as stated: no number picked out of prose
        return (
            Extraction(clean_answer_text(stated, False), "answer_line")
            if stated
            else Extraction(None, "none")
        )
    phrase = _last_answer_phrase(tail)
    if phrase is not None:
        return Extraction(clean_answer_text(phrase), "answer_line")
    line = _bare_final_line(tail)
    if line is not None:
        return Extraction(line, "bare_line")
    return _final_statement(tail)


def _final_answer_line(text: str) -> str | None:
    """The answer stated by the last non-empty line of `text` (`#### X`, "Answer: X", "... the
    answer is X.", or X under a "Final Answer" heading on the line before), else None."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    last = lines[-1]
    for pattern in (_GSM8K_MARKER, _ANSWER_LINE, _ANSWER_PHRASE):
        match = _last_match(pattern, last)
        if match is not None and not last[match.end() :].strip(" \t.*_!"):
            return match.group(1)
    heading = _ANSWER_HEADING.search("\n".join(lines[-2:])) if len(lines) > 1 else None
    return heading.group(1) if heading is not None else None


def _last_match(pattern: re.Pattern[str], text: str) -> re.Match[str] | None:
    last = None
    for last in pattern.finditer(text):  # noqa: B007 - the loop keeps the last match
        pass
    return last


def _last_answer_phrase(text: str) -> str | None:
    """The last "Answer: X" line, "**Final Answer**" heading over X, "the answer is X" phrase or
    GSM8K `#### X` marker."""
    patterns = (_ANSWER_LINE, _ANSWER_HEADING, _ANSWER_PHRASE, _GSM8K_MARKER)
    matches = [m for pattern in patterns for m in pattern.finditer(text)]
    if not matches:
        return None
    return max(matches, key=lambda m: m.start()).group(1)


def _bare_final_line(text: str) -> str | None:
    """The last non-empty line when it is all math and no prose (`-5`, `\\frac{3}{4}`, `x = 5`,
    `1,000.99`): a bare answer written without delimiters."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return None
    line = re.sub(r"[.;,!]+$", "", lines[-1].strip("*_ ")).strip()
    line = GLUED_OR.sub(" or ", line)
    if not line or len(line) > 200 or _DELIMITER_CHARS.search(line):
        return None
    letters = _COMMAND.sub(" ", _TEXT_ARGUMENT.sub(" ", line))
    if _WORD.search(letters) or not re.search(r"\d|\\[a-zA-Z]", line):
        return None
    return line


def _final_statement(text: str) -> Extraction:
    """The answer of the last statement that holds one: its last number, or its last inline math
    span when the statement has one (`$x = 5$ is the solution to part 2.` gives `x = 5`)."""
    spans = [
        (m.start(), m.end(), m.group(m.lastgroup).strip(), m.lastgroup)
        for m in _MATH_SPAN.finditer(text)
        if m.lastgroup
    ]
    masked = _MATH_SPAN.sub(lambda m: " " * len(m.group(0)), text)
    masked = _BROKEN_MATH.sub(lambda m: " " * len(m.group(0)), masked)  # `$ \n 9 \n $`: not an answer
    numbers = list(_NUMBER_TOKEN.finditer(masked))
    if not spans and not numbers:
        return Extraction(None, "none")
    last_span = spans[-1] if spans else None
    last_number = numbers[-1] if numbers else None
    if last_span is not None and (last_number is None or last_span[1] > last_number.start()):
        return Extraction(last_span[2], "math_span")
    assert last_number is not None
    if (
        last_span is not None
        and last_span[3] in ("c", "d")
        and not _SENTENCE_END.search(masked, last_span[1], last_number.start())
    ):
        return Extraction(last_span[2], "math_span")  # same sentence: the math is the answer
    sentence_start = max((m.end() for m in _SENTENCE_END.finditer(masked, 0, last_number.start())), default=0)
    rest = masked[: last_number.start()] + masked[last_number.end() :]
    lone = not re.search(r"\d", rest) and len(_WORD.findall(rest)) <= 1  # `$1,000.99`, `28 pct`, `12 cm`
    if not lone and not _CONCLUSION.search(masked, sentence_start, last_number.start()):
        # "The cube has 8 vertices, but I am not sure..." states no result; a lone number does.
        return Extraction(last_span[2], "math_span") if last_span else Extraction(None, "none")
    return Extraction(last_number.group(0).strip(), "last_number")


def clean_answer_text(text: str, number_in_prose: bool = True) -> str:
    """An answer phrase as bare LaTeX: markdown emphasis, trailing punctuation, "I hope it is
    correct" and math delimiters removed. When the phrase mixes prose and math, the math is kept:
    what follows the last "is" when that holds math (`the largest $n$ is 34` gives `34`), else the
    math spans, else, when `number_in_prose`, the last number (`Jane started 3 hours ago` gives
    `3`); without it, the phrase as it is (prose, which parses as no answer)."""
    text = _HOPE.split(text, maxsplit=1)[0].replace('\\"', '"')
    text = text.strip().strip("*_\"'").strip()
    text = re.sub(r"[.;,!]+$", "", text).strip()
    if not is_prose(text):
        return _math_of(text)
    copula = None
    for copula in _COPULA.finditer(text):  # noqa: B007 - the loop keeps the last match
        pass
    if copula is not None:
        stated = text[copula.end() :].strip()
        if _MATH_SPAN.search(stated) or _NUMBER_TOKEN.search(stated):
            return clean_answer_text(stated, number_in_prose)
    if _MATH_SPAN.search(text):
        return _math_of(text)
    numbers = list(_NUMBER_TOKEN.finditer(text)) if number_in_prose else []
    return numbers[-1].group(0).strip() if numbers else text


def _math_of(text: str) -> str:
    """The math of a phrase: its math spans (joined by their connectors when they are alternatives
    such as "$x = 1$ or $x = 2$", else the last one), or the phrase itself when it has none."""
    spans = list(_MATH_SPAN.finditer(text))
    if not spans:
        return text
    residue = _MATH_SPAN.sub(" ", text)
    if _CONNECTOR_ONLY.match(residue):
        return " ".join(_MATH_SPAN.sub(lambda m: f" {m.group(m.lastgroup)} ", text).split())
    return spans[-1].group(spans[-1].lastgroup).strip()


def is_prose(text: str) -> bool:
    """Whether a phrase has words outside its math (`The largest $n$ is 34`), not only math and
    connectors (`$x = 1$ or $x = 2$`, `\\frac{1}{2}`, `5 \\text{ cm}`)."""
    outside = _COMMAND.sub(" ", _TEXT_ARGUMENT.sub(" ", _MATH_SPAN.sub(" ", text)))
    return len([w for w in _WORD.findall(outside) if w.lower() not in ("and", "or")]) >= 2


def strip_delimiters(text: str) -> str:
    """`text` without surrounding math delimiters (`$`, `$$`, `\\(`, `\\[`) or a wrapping `\\boxed{}`."""
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for left, right in _DELIMITERS:
            inner = text[len(left) : len(text) - len(right)]
            if (
                text.startswith(left)
                and text.endswith(right)
                and inner
                and left not in inner
                and right not in inner
            ):
                text = inner.strip()  # one span around everything, not "$5$ and $6$"
                changed = True
        box = _BOX_COMMAND.match(text)
        if (
            box
            and text[box.end() : box.end() + 1] == "{"
            and _closing_braces(text).get(box.end()) == len(text) - 1
        ):
            text = text[box.end() + 1 : -1].strip()
            changed = True
    return text
