"""Finding the final answer in a model completion.

Reasoning inside `<think>...</think>` never counts. Outside it the answer is, in order of preference:
the last `\\boxed{}` / `\\fbox{}`, the Minerva sentence "The final answer is X. I hope it is correct.",
an "Answer: X" line (or "the answer is X"), and the last `$...$` math span as a fallback; all but
the boxes are looked for near the end of the completion.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# Answer phrases and math spans are looked for in the last TAIL_CHARS characters only, and boxes
# are matched in one pass, so degenerate completions (megabytes of repeated "the answer is", "$$"
# or "\\boxed{") cost linear time.
TAIL_CHARS = 4000
_THINK_TAG = re.compile(r"<(/?)think(?:ing)?>", re.IGNORECASE)
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)\s*")
_BOX_TOKEN = re.compile(r"[^\s$]+")
_MINERVA = re.compile(r"final answer is\s*:?\s*(.{1,500}?)\.?\s*I hope it is correct", re.IGNORECASE | re.DOTALL)
_ANSWER_LINE = re.compile(
    r"(?:^|(?<=[.!?]\s))[\s>#*_-]*(?:final\s+)?answer\s*(?:\*\*|__)?\s*[:：]\s*(?:\*\*|__)?(.{1,500}?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_ANSWER_HEADING = re.compile(r"^[\s>#*_-]*final\s+answer[\s*_]*:?[\s*_]*\n\s*(.{1,500}?)\s*$", re.IGNORECASE | re.MULTILINE)
_ANSWER_PHRASE = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\s*:?\s*(.{1,500}?)(?:\.(?=\s|$)|\n|$)", re.IGNORECASE)
_MATH_SPAN = re.compile(
    r"\$\$(?P<a>.{1,2000}?)\$\$|\\\[(?P<b>.{1,2000}?)\\\]|\\\((?P<c>.{1,2000}?)\\\)"
    r"|(?<![\\$])\$(?P<d>[^$\n]{1,2000}?)(?<!\\)\$",
    re.DOTALL,
)
_DELIMITERS = (("$$", "$$"), ("\\[", "\\]"), ("\\(", "\\)"), ("$", "$"))
_CONNECTOR_ONLY = re.compile(r"^(?:[\s,;.]|\bor\b|\band\b)*$", re.IGNORECASE)


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
    closes = _closing_braces(text)
    found = []
    for match in _BOX_COMMAND.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            if start in closes:
                found.append(text[start + 1 : closes[start]].strip())
        elif match.group(0)[-1:].isspace():
            token = _BOX_TOKEN.match(text, start)
            if token:
                found.append(token.group(0).rstrip(".,"))
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


def extract_answer(completion: str) -> Extraction:
    """Find the final answer of `completion` (see the module docstring for the forms tried)."""
    text = strip_reasoning(completion)
    boxed = tuple(find_boxed(text))
    if boxed:
        return Extraction(boxed[-1], "boxed", boxed)
    tail = text[-TAIL_CHARS:]
    minerva = _last_match(_MINERVA, tail)
    if minerva is not None:
        return Extraction(clean_answer_text(minerva), "final_answer")
    phrase = _last_answer_phrase(tail)
    if phrase is not None:
        return Extraction(clean_answer_text(phrase), "answer_line")
    spans = [m.group(m.lastgroup) for m in _MATH_SPAN.finditer(tail) if m.lastgroup]
    if spans:
        return Extraction(spans[-1].strip(), "math_span")
    return Extraction(None, "none")


def _last_match(pattern: re.Pattern[str], text: str) -> str | None:
    matches = list(pattern.finditer(text))
    return matches[-1].group(1) if matches else None


def _last_answer_phrase(text: str) -> str | None:
    """The last "Answer: X" line, "**Final Answer**" heading over X, or "the answer is X" phrase."""
    matches = [m for pattern in (_ANSWER_LINE, _ANSWER_HEADING, _ANSWER_PHRASE) for m in pattern.finditer(text)]
    if not matches:
        return None
    return max(matches, key=lambda m: m.start()).group(1)


def clean_answer_text(text: str) -> str:
    """An answer phrase as bare LaTeX: markdown emphasis, trailing punctuation and math delimiters
    removed. When the phrase mixes prose and math, the math is kept."""
    text = text.strip().strip("*_").strip()
    text = re.sub(r"[.;,!]+$", "", text).strip()
    spans = list(_MATH_SPAN.finditer(text))
    if spans:
        residue = _MATH_SPAN.sub(" ", text)
        contents = [m.group(m.lastgroup).strip() for m in spans if m.lastgroup]
        if _CONNECTOR_ONLY.match(residue):
            # "$x = 1$ or $x = 2$": keep the connectors so alternatives stay visible.
            return " ".join(_MATH_SPAN.sub(lambda m: f" {m.group(m.lastgroup)} ", text).split())
        return contents[-1]
    return text


def strip_delimiters(text: str) -> str:
    """`text` without surrounding math delimiters (`$`, `$$`, `\\(`, `\\[`) or a wrapping `\\boxed{}`."""
    text = text.strip()
    changed = True
    while changed:
        changed = False
        for left, right in _DELIMITERS:
            inner = text[len(left) : len(text) - len(right)]
            if text.startswith(left) and text.endswith(right) and inner and left not in inner and right not in inner:
                text = inner.strip()  # one span around everything, not "$5$ and $6$"
                changed = True
        box = _BOX_COMMAND.match(text)
        if box and text[box.end() : box.end() + 1] == "{" and _closing_braces(text).get(box.end()) == len(text) - 1:
            text = text[box.end() + 1 : -1].strip()
            changed = True
    return text
