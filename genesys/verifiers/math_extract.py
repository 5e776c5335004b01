"""Finding the final answer in a model completion.

Reasoning inside `<think>...</think>` never counts. Outside it the answer is, in order of preference:
the last `\\boxed{}` / `\\fbox{}`, the Minerva sentence "The final answer is X. I hope it is correct.",
an "Answer: X" line (or "the answer is X"), and the last `$...$` math span as a fallback.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_THINK_BLOCK = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think(?:ing)?>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think(?:ing)?>", re.IGNORECASE)
_BOX_COMMAND = re.compile(r"\\(?:boxed|fbox)\s*")
_MINERVA = re.compile(r"final answer is\s*:?\s*(.+?)\.?\s*I hope it is correct", re.IGNORECASE | re.DOTALL)
_ANSWER_LINE = re.compile(
    r"\b(?:final\s+)?answer\s*(?:\*\*|__)?\s*[:：]\s*(?:\*\*|__)?(.+?)\s*$",
    re.IGNORECASE | re.MULTILINE,
)
_ANSWER_PHRASE = re.compile(r"\bthe\s+(?:final\s+)?answer\s+is\s*:?\s*(.+?)(?:\.(?=\s|$)|\n|$)", re.IGNORECASE)
_MATH_SPAN = re.compile(
    r"\$\$(?P<a>.+?)\$\$|\\\[(?P<b>.+?)\\\]|\\\((?P<c>.+?)\\\)|(?<![\\$])\$(?P<d>[^$\n]+?)(?<!\\)\$",
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
    text = _THINK_BLOCK.sub(" ", text)
    closes = list(_THINK_CLOSE.finditer(text))
    if closes:
        text = text[closes[-1].end() :]
    opened = _THINK_OPEN.search(text)
    if opened:
        text = text[: opened.start()]
    return text


def find_boxed(text: str) -> list[str]:
    """The contents of every complete `\\boxed{...}` / `\\fbox{...}` in `text`, in order.

    Braces are matched with escaped braces (`\\{`, `\\}`) skipped; a box cut off by the end of the
    text is ignored. `\\boxed 5` (no braces) yields its single token.
    """
    found = []
    for match in _BOX_COMMAND.finditer(text):
        start = match.end()
        if start < len(text) and text[start] == "{":
            content = _balanced_group(text, start)
            if content is not None:
                found.append(content.strip())
        elif match.group(0).endswith(" ") or match.group(0).endswith("\t"):
            token = re.match(r"[^\s$]+", text[start:])
            if token:
                found.append(token.group(0).rstrip(".,"))
    return found


def _balanced_group(text: str, open_index: int) -> str | None:
    depth = 0
    i = open_index
    while i < len(text):
        char = text[i]
        if char == "\\":
            i += 2
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[open_index + 1 : i]
        i += 1
    return None


def extract_answer(completion: str) -> Extraction:
    """Find the final answer of `completion` (see the module docstring for the forms tried)."""
    text = strip_reasoning(completion)
    boxed = tuple(find_boxed(text))
    if boxed:
        return Extraction(boxed[-1], "boxed", boxed)
    minerva = _last_match(_MINERVA, text)
    if minerva is not None:
        return Extraction(clean_answer_text(minerva), "final_answer")
    phrase = _last_answer_phrase(text)
    if phrase is not None:
        return Extraction(clean_answer_text(phrase), "answer_line")
    spans = [m.group(m.lastgroup) for m in _MATH_SPAN.finditer(text) if m.lastgroup]
    if spans:
        return Extraction(spans[-1].strip(), "math_span")
    return Extraction(None, "none")


def _last_match(pattern: re.Pattern[str], text: str) -> str | None:
    matches = list(pattern.finditer(text))
    return matches[-1].group(1) if matches else None


def _last_answer_phrase(text: str) -> str | None:
    """The last "Answer: X" line or "the answer is X" phrase, whichever comes later."""
    matches = list(_ANSWER_LINE.finditer(text)) + list(_ANSWER_PHRASE.finditer(text))
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
            if text.startswith(left) and text.endswith(right) and len(text) > len(left) + len(right):
                text = text[len(left) : len(text) - len(right)].strip()
                changed = True
        box = _BOX_COMMAND.match(text)
        if box and text[box.end() : box.end() + 1] == "{":
            content = _balanced_group(text, box.end())
            if content is not None and box.end() + len(content) + 2 == len(text):
                text = content.strip()
                changed = True
    return text
