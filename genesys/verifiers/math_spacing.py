"""Horizontal space in LaTeX answers: one vocabulary for every way of writing it.

Spacing never carries a value, but it decides how the values around it are read:
- a *thin* space between groups of exactly three digits is a thousands separator (`1\\,000`,
  `12\\thinspace 345`, `1\\!000`, `1\\ 000`, U+2009, U+202F); `THOUSANDS_SEPARATOR` matches those;
- any other space between two numbers sets apart two values (`5\\qquad6`, `5 \\thinspace 6`,
  `5\\medspace 6`, `5 \\text{ } 6` are two answers, never 56 or 11);
- a *wide* space (`\\quad`, `\\enspace`, `\\hspace{..}`, `~`, `\\text{ }`, ...) also sets apart two
  values that are not bare numbers (`\\frac{1}{2} \\quad \\frac{1}{3}`), while a thin one between a
  number and a symbol is typography (`3\\,\\sqrt{2}`, `2\\,\\pi`).

`canonical_spacing` rewrites every space as ` \\quad ` (wide) or ` \\, ` (thin), so the rules above are
written once, on two tokens.
"""

from __future__ import annotations

import re

_TEXT_BOXES = r"\\(?:text|textrm|textnormal|textup|mbox|hbox|mathrm)"
_INNER_SPACE = (
    r"(?:\s|~|\\[,:;!> ]|\\(?:q?quad|enspace|enskip|thinspace|medspace|thickspace|space)(?![a-zA-Z]))"
)
_WIDE = re.compile(
    _TEXT_BOXES + r"\s*\{" + _INNER_SPACE + r"*\}"  # `\text{ }`, `\mbox{~}`, `\text{}`
    r"|\\(?:hspace\*?|h?phantom)\s*\{[^{}]*\}"
    r"|\\(?:hskip|mskip|kern|mkern)\s*-?\d*\.?\d+\s*(?:em|ex|pt|mu|cm|mm|in|pc|bp|sp)"
    r"|\\(?:qquad|quad|enspace|enskip|hfill|space|nobreakspace)(?![a-zA-Z])"
    r"|(?<!\\)\\ |~|[\u00a0\u2002\u2003\u2007\u3000]"
)
_THIN = re.compile(
    r"(?<!\\)\\[,:;!>]"
    r"|\\(?:thinspace|medspace|thickspace|negthinspace|negmedspace|negthickspace)(?![a-zA-Z])"
    r"|[\u2004-\u2006\u2008-\u200b\u202f\u205f]"
)
WIDE, THIN = r"\quad", r"\,"
# What may stand between groups of three digits of one number.
THOUSANDS_SEPARATOR = r"(?:\{,\}|,\s*\\!\s*|\\[,! ]|\\thinspace(?![a-zA-Z])\s*|[\u2009\u202f])"
# Two values set apart by spacing alone: numbers by any space, other values by a wide one.
# (A digit right after `_` or `^` is a subscript or exponent: `\log_2 8` is one value.)
JUXTAPOSED = re.compile(
    r"(?<=\d)(?<![_^]\d)\s*(?:(?:\\quad|\\,)\s*)+(?=\(?\s*-?\d)"
    r"|(?<=[\d})\]])\s*(?:\\quad\s*)+(?=[(\[]|-?\s*(?:\d|\\[dt]?frac|\\sqrt))"
    r"|(?<=\d)(?<![_^]\d)\s+(?=\(?\s*-?\d)"
)
_CANONICAL = re.compile(r"\s*(?:\\quad|\\,)(?:\s*(?:\\quad|\\,))*\s*")


def canonical_spacing(text: str) -> str:
    """`text` with every horizontal space written as ` \\quad ` (wide) or ` \\, ` (thin); a run of
    spaces is wide when any of them is."""
    text = _THIN.sub(lambda _: f" {THIN} ", _WIDE.sub(lambda _: f" {WIDE} ", text))
    return _CANONICAL.sub(lambda m: f" {WIDE if WIDE in m.group(0) else THIN} ", text)


def without_spacing(text: str) -> str:
    """`text` with every horizontal space written as one plain space."""
    return _THIN.sub(" ", _WIDE.sub(" ", text))
