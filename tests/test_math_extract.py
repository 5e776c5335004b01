"""Finding the final answer in completions: boxes, answer phrases, think blocks."""

from __future__ import annotations

import time

import pytest

from genesys.verifiers.math_extract import (
    Extraction,
    clean_answer_text,
    extract_answer,
    find_boxed,
    strip_reasoning,
)


def test_last_boxed_wins_and_nested_braces_are_kept() -> None:
    found = extract_answer(r"First \boxed{1}. Then $\boxed{\frac{1}{2}}$ and finally \boxed{\{1, 2\}}.")
    assert found.method == "boxed"
    assert found.answer == r"\{1, 2\}"
    assert found.boxed == ("1", r"\frac{1}{2}", r"\{1, 2\}")


def test_fbox_and_unbraced_boxed() -> None:
    assert extract_answer(r"so \fbox{12}").answer == "12"
    assert find_boxed(r"the answer is \boxed 7.") == ["7"]


def test_box_cut_off_by_the_end_of_the_text_is_ignored() -> None:
    assert find_boxed(r"\boxed{3} and then \boxed{\frac{1}{") == ["3"]


def test_empty_box_is_an_empty_answer() -> None:
    found = extract_answer(r"I give up: \boxed{}")
    assert found.answer == "" and found.method == "boxed"


def test_minerva_final_answer_sentence() -> None:
    found = extract_answer(
        "So it is 3/4.\nFinal Answer: The final answer is $\\frac{3}{4}$. I hope it is correct."
    )
    assert (found.answer, found.method) == (r"\frac{3}{4}", "final_answer")


@pytest.mark.parametrize(
    "completion",
    [
        "Reasoning.\n\n**Answer: 15**",
        "Reasoning.\n\n**Answer:** 15",
        "Reasoning.\nAnswer: $15$.",
        "Thus the answer is 15.",
        "Reasoning.\n\n**Final Answer**\n\n$15$",
    ],
)
def test_answer_lines_and_phrases(completion: str) -> None:
    found = extract_answer(completion)
    assert (found.answer, found.method) == ("15", "answer_line")


def test_answer_word_inside_a_sentence_is_not_an_answer_line() -> None:
    found = extract_answer("Let me check my answer: it seems right. So $x = 5$", "lenient")
    assert (found.answer, found.method) == ("x = 5", "math_span")


def test_answer_phrase_with_several_math_spans_keeps_connectors() -> None:
    assert extract_answer("Answer: $x=1$ or $x=2$").answer == "x=1 or x=2"
    assert clean_answer_text("the value $5$, as computed above") == "5"


def test_last_math_span_is_the_fallback() -> None:
    found = extract_answer(r"We get $2x = 5$, hence $x = \frac{5}{2}$", "lenient")
    assert (found.answer, found.method) == (r"x = \frac{5}{2}", "math_span")


def test_no_answer() -> None:
    assert extract_answer("I am not sure how to continue").method == "none"
    assert extract_answer("I am not sure how to continue").answer is None


def test_think_block_content_never_counts() -> None:
    assert extract_answer(r"<think>clearly \boxed{5}</think> The answer is \boxed{7}.").answer == "7"
    assert extract_answer(r"<think>clearly \boxed{5}</think> I do not know.").answer is None


def test_unclosed_think_block_is_all_reasoning() -> None:
    assert extract_answer(r"<think>so far \boxed{5} but let me check").answer is None


def test_text_before_an_orphan_closing_tag_is_reasoning() -> None:
    # Chat templates often put <think> into the prompt, so the completion starts inside the block.
    assert strip_reasoning("draft \\boxed{1}</think>final \\boxed{2}") == "final \\boxed{2}"
    assert extract_answer("draft \\boxed{1}</think>final \\boxed{2}").boxed == ("2",)


@pytest.mark.slow
def test_degenerate_completions_are_scanned_in_linear_time() -> None:
    # Repetitive RL output must not make extraction quadratic (per-match rescans). Four times the
    # input must take about four times as long, not sixteen: the ratio, best of three, is checked,
    # so a loaded machine slows both sizes alike.
    pieces = ["the answer is ", "$$ ", "\\boxed{", "<think>", "final answer is ", "\\[", "\\boxed "]

    def seconds(repeats: int) -> float:
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            for piece in pieces:
                for policy in ("boxed", "lenient"):
                    extract_answer(piece * repeats, policy)
            best = min(best, time.perf_counter() - started)
        return best

    assert seconds(80_000) / seconds(20_000) < 8.0


# --- the answer_format policy ------------------------------------------------------------------------

NOISE = [
    "blah is 5 blah",
    "Numbers: 3, 9, 5",
    "ruk 5 ffo the 17 answer zz\n\n42",
    "so the probability is 2/3.",
    "$x = 5$",
    "-5",
    "The answer is 5.\nLet me double check that.",
    "Answer: 5\nBut maybe it is 6 instead, I am not sure about this.",
]


@pytest.mark.parametrize("completion", NOISE)
def test_the_boxed_policy_finds_no_answer_in_text_without_an_explicit_one(completion: str) -> None:
    assert extract_answer(completion, "boxed") == extract_answer(completion) == Extraction(None, "none")
    assert extract_answer(completion, "lenient").answer is not None  # the lenient policy reads a number


@pytest.mark.parametrize(
    "completion",
    [
        "Reasoning.\n\nAnswer: 15",
        "Reasoning.\n\n**Answer:** $15$.",
        "Reasoning.\nFinal answer: 15",
        "We add them up. Thus the answer is 15.",
        "We add them up.\nThe final answer is $15$.",
        "Natalia sold 48 + 24 clips.\n#### 15",
        "Reasoning.\n\n**Final Answer**\n\n$15$",
        "Reasoning. The answer is: 15",
    ],
)
def test_the_boxed_policy_reads_an_explicit_answer_on_the_last_line(completion: str) -> None:
    found = extract_answer(completion, "boxed")
    assert (found.answer, found.method) == ("15", "answer_line")
    assert extract_answer(completion, "lenient").answer == "15"


def test_boxes_and_the_minerva_sentence_count_under_both_policies() -> None:
    for policy in ("boxed", "lenient"):
        assert extract_answer("so \\boxed{7}. Then some words 12 and 13", policy).answer == "7"
        minerva = "Final Answer: The final answer is $7$. I hope it is correct."
        assert extract_answer(minerva, policy).answer == "7"


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(ValueError, match="answer_format must be one of boxed, lenient"):
        extract_answer("\\boxed{5}", "strict")
