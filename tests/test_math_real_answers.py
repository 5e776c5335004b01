"""Answers as real datasets and models write them: each class accepted when right, rejected when a
near miss (bare answers, separators, constants, labels, chains, boxes, mixed numbers, gold formats,
dataset markers, times and ratios, false relations and juxtaposed numbers)."""

from __future__ import annotations

import pytest

from genesys.verifiers.math_grade import grade


def score(gold: str, completion: str) -> float | None:
    return grade(gold, completion, answer_format="lenient").score


def both_ways(gold: str, right: str, near_miss: str) -> None:
    """The right answer scores 1 under the lenient policy, the near miss 0 under both; the boxed
    policy accepts the right answer too, or finds no answer in it, never another one."""
    assert score(gold, right) == 1.0, grade(gold, right, "lenient").details
    assert score(gold, near_miss) == 0.0, grade(gold, near_miss, "lenient").details
    strict = grade(gold, right, "boxed")
    assert strict.score == 1.0 or strict.details["reason"] == "no_answer", strict.details
    assert grade(gold, near_miss, "boxed").score == 0.0


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        ("1000.99", "1,000.99", "1,000.90"),
        ("-5", "-5", "5"),
        ("3/4", "3/4", "4/3"),
        ("3/4", r"\frac{3}{4}", r"\frac{4}{3}"),
        ("-5", "After simplifying, the value is\n-5", "After simplifying, the value is\n5"),
        ("1000.99", "$1,000.99", "$1,000.90"),
        (
            "2/3",
            "So the probability that Alice wins is 2/3. <|im_start|>user",
            "So the probability is 1/3. <|im_start|>user",
        ),
        (
            "12",
            "Therefore, there are 12 sequences. I hope it is correct.",
            "Therefore, there are 13 sequences.",
        ),
    ],
)
def test_bare_answers_without_delimiters(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


def test_a_number_in_prose_that_states_no_result_is_no_answer() -> None:
    assert (
        grade("8", "The cube has 8 vertices, but I am not sure how to count the edges.").details["reason"]
        == "no_answer"
    )
    assert score("2", "AZYUK2A") == 0.0  # a digit inside a word is not a number
    assert score("9", "Answer $ \n 9 \n $") == 0.0  # inline math broken over lines is not read


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        ("12345", r"\boxed{12,\!345}", r"\boxed{12,\!354}"),
        ("1234.5", r"\boxed{\$1,\!234.50}", r"\boxed{\$1,\!243.50}"),
        ("1000", r"\boxed{1{,}000}", r"\boxed{1{,}001}"),
        ("1000", r"\boxed{1\,000}", r"\boxed{1\,001}"),
        ("1000", "1 000", "1 001"),
        ("11111111100", r"\boxed{11,\! 111,\! 111,\! 100}", r"\boxed{11,\! 111,\! 111,\! 101}"),
        ("1,2,3", r"\boxed{1, 2, 3}", r"\boxed{123}"),
        ("1234", r"\boxed{1,234}", r"\boxed{1, 234}"),
        ("1000.99", "1000,99", "1000,90"),
    ],
)
def test_thousands_separators(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        (r"\mathrm{e}", r"\boxed{e}", r"\boxed{2.718}"),
        (r"\text{e}", r"\boxed{e}", r"\boxed{\pi}"),
        (r"1 - \frac{1}{\mathrm{e}}", r"\boxed{1 - e^{-1}}", r"\boxed{1 + \frac{1}{\mathrm{e}}}"),
        (r"2 - 3\mathrm{i}", r"\boxed{2 - 3i}", r"\boxed{2 + 3i}"),
        (r"\operatorname{lcm}(4, 6)", r"\boxed{12}", r"\boxed{24}"),
        (r"12 \text{ cm}", r"\boxed{12}", r"\boxed{13 \text{ cm}}"),
        (r"60^\circ", r"\boxed{60^{\circ}}", r"\boxed{30^{\circ}}"),
        (r"\cos x", r"\boxed{\sin(90^\circ - x)}", r"\boxed{\sin(90 - x)}"),
        (r"\frac{\sqrt{3}}{2}", r"\boxed{\sin 60^\circ}", r"\boxed{\sin 60}"),
        (r"28\%", "28 percent", "27 percent"),
        (r"28\%", r"\boxed{28 pct}", r"\boxed{29 pct}"),
    ],
)
def test_constants_units_degrees_and_percent(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        ("(p, q) = (3, 2)", r"\boxed{(3, 2)}", r"\boxed{(2, 3)}"),
        ("x = 5", r"\boxed{5}", r"\boxed{y = 5}"),
        ("AB = 4, CD = 5", r"\boxed{4, 5}", r"\boxed{5, 4}"),
        ("|AB| = 1", r"\boxed{1}", r"\boxed{2}"),
        (r"V_1 : V_2 = 11 : 21", r"\boxed{11:21}", r"\boxed{21:11}"),
        (r"\frac{NO}{BO} = \frac{1}{\sqrt{6}}", r"\boxed{\frac{1}{\sqrt{6}}}", r"\boxed{\sqrt{6}}"),
        ("2", r"\boxed{x = 2}", r"\boxed{x^2 = 4}"),
        ("1", r"\boxed{k = 1}", r"\boxed{2x + z = 1}"),
    ],
)
def test_labelled_and_assigned_answers(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        ("11", r"\boxed{x = 5 + 5 + 1 = 11}", r"\boxed{x = 5 + 5 + 1 = 12}"),
        ("x = 11", r"$x = 5+5+1 = 11$", r"$x = 5+5+1 = 7 = 11$"),  # every link of a chain must hold
        ("z = 1 + 1 = 2", r"$z = 4 - 2 = 2$", r"$z = 3 + 3 = 2$"),
        ("5", r"\boxed{7 - 2 = 6 - 1 = 5}", r"\boxed{6 = 7 = 5}"),
        ("5", r"\boxed{a = b = 5}", r"\boxed{x = 6 = 7 = 5}"),
        ("[-2, 7]", r"\boxed{-2 \le x \le 7}", r"\boxed{-2 < x \le 7}"),
        ("0 < f(x) < 1", r"\boxed{(0, 1)}", r"\boxed{(0, 1]}"),
        (
            r"(-\infty, -3] \cup [2, \infty)",
            r"\boxed{x \le -3 \text{ or } x \ge 2}",
            r"\boxed{x < -3 \text{ or } x \ge 2}",
        ),
        ("f(2) < f(1) < f(4)", r"\boxed{f(2) < f(1) < f(4)}", r"\boxed{f(1) < f(2) < f(4)}"),
    ],
)
def test_chains_and_intervals(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        (r"\boxed{1}\boxed{2}", r"\boxed{1,2}", r"\boxed{1,3}"),
        (r"\(\boxed{1}\) and \(\boxed{-2}\).", r"$\boxed{-2,1}$", r"$\boxed{-2}$"),
        (r"\boxed{1} papers and \boxed{2} bins", r"\boxed{1, 2}", r"\boxed{2}"),
        (
            "(1, 2), (2, 1)",
            r"So $\boxed{(1, 2)}$ and $\boxed{(2, 1)}$.",
            r"So $\boxed{(1, 2)}$ and $\boxed{(2, 2)}$.",
        ),
    ],
)
def test_several_boxes(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


def test_boxes_set_apart_by_a_sentence_are_not_one_gold() -> None:
    assert score(r"\boxed{1} no no no no no \boxed{2}", r"\boxed{1, 2}") == 0.0
    assert score(r"\boxed{1} no no no no no \boxed{2}", r"\boxed{2}") == 1.0


def test_several_different_boxes_for_one_part_stay_a_hedge() -> None:
    verdict = grade("5", r"It is $\boxed{5}$, or maybe $\boxed{6}$.")
    assert (verdict.score, verdict.details["reason"]) == (0.0, "hedging")


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        (r"\frac{3}{2}", "1 1/2", "1 1/3"),
        (r"\frac{3}{2}", r"\boxed{1\frac{1}{2}}", r"\boxed{1}"),
        (r"1 \frac{1}{2}", r"\boxed{1.5}", r"\boxed{\frac{1}{2}}"),
        (r"-\frac{5}{2}", r"\boxed{−2\frac{1}{2}}", r"\boxed{2\frac{1}{2}}"),
        ("6", r"\boxed{2 × 3}", r"\boxed{2 ÷ 3}"),
        ("-3", r"\boxed{&minus;3}", r"\boxed{3}"),
    ],
)
def test_mixed_numbers_and_unicode_signs(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


CASES_GOLD = r"f(n) = \begin{cases} n/2 & n \text{ even} \\ 3n+1 & n \text{ odd} \end{cases}"


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        (
            CASES_GOLD,
            r"\boxed{\begin{cases} 3n+1 & n \text{ odd} \\ \frac{n}{2} & n \text{ even} \end{cases}}",
            r"\boxed{\begin{cases} \frac{n}{2} & n \text{ odd} \\ 3n+1 & n \text{ even} \end{cases}}",
        ),
        ("5\\", r"\boxed{5}", r"\boxed{6}"),
        (r"\dfrac{3}{4}", r"\boxed{\tfrac34}", r"\boxed{\tfrac43}"),
        (r"\left( 3, \frac{\pi}{2} \right)", r"\boxed{(3, \frac{\pi}{2})}", r"\boxed{(\frac{\pi}{2}, 3)}"),
        ("no solution", r"\boxed{\text{No solution}}", r"\boxed{0}"),
        ("A", r"\boxed{A}", r"\boxed{B}"),
        (r"-2 \\le x \\le 7", r"\boxed{x \in [-2, 7]}", r"\boxed{x \in [-2, 7)}"),
    ],
)
def test_gold_formats_are_read(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


def test_a_gold_that_cannot_be_read_is_an_error_quoting_it() -> None:
    verdict = grade(r"\frac{", r"\boxed{5}")
    assert verdict.score is None
    assert verdict.error.startswith("invalid_ground_truth") and r"\\frac{" in verdict.error


BOX_THEN_MINERVA = (
    "First $\\boxed{{255}}$ in interest.\nFinal Answer: The final answer is ${}$. I hope it is correct."
)
GSM8K_GOLD = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nAltogether she sold 48+24 = <<48+24=72>>72 clips.\n#### 72"


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        (GSM8K_GOLD, "She sold 24 in May, 72 in all.\n#### 72", "She sold 48 + 48.\n#### 96"),
        ("72", "48 + 24 = 72.\nThe answer is: 72", "48 + 48 = 96.\nThe answer is: 96"),
        ("72", "Answer: 72", "Answer: 96"),
        (
            "42",
            r"<think>maybe \boxed{41}</think> so \boxed{42}",
            r"<think>maybe \boxed{42}</think> so \boxed{41}",
        ),
        (
            "42",
            "Final Answer: The final answer is 42. I hope it is correct.",
            "Final Answer: The final answer is 24. I hope it is correct.",
        ),
        ("10455", BOX_THEN_MINERVA.format("10,455"), BOX_THEN_MINERVA.format("10,545")),
        ("34", "Final Answer: The largest $n$ is 34.", "Final Answer: The largest $n$ is 35."),
        (
            r"28\%",
            r"Final Answer: The final answer is $28 \%$. I hope it is correct.",
            r"Final Answer: The final answer is $72 \%$. I hope it is correct.",
        ),
    ],
)
def test_dataset_answer_markers(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


def test_a_gold_sentence_is_read_for_its_result() -> None:
    both_ways("There are 12 ways to do it.", r"\boxed{12}", r"\boxed{13}")
    both_ways(
        "The midpoints form a regular hexagon",
        r"\boxed{\text{The midpoints form a regular hexagon}}",
        r"\boxed{\text{a square}}",
    )


def test_a_long_gold_solution_is_read_for_its_final_answer() -> None:
    solution = (
        "Let us reason at length. " * 60 + "Final Answer: The final answer is $28 \\%$. I hope it is correct."
    )
    both_ways(solution, r"\boxed{28\%}", r"\boxed{72\%}")


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        ("12:00", r"\boxed{12:00}", r"\boxed{1:00}"),
        ("7:05 pm", r"\boxed{7:05 \text{ pm}}", r"\boxed{7:05 \text{ am}}"),
        ("3:2", r"\boxed{6:4}", r"\boxed{2:3}"),
        (r"\frac{3}{2}", r"\boxed{1.5}", r"\boxed{3:2}"),
    ],
)
def test_times_and_ratios(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        ("5", r"\boxed{\frac{15}{3} \approx 5.0}", r"\boxed{5 \approx 6}"),
        ("11", r"\boxed{x \approx 11}", r"\boxed{x \approx 12}"),
        (r"\frac{1}{3}", r"\boxed{x = \frac{1}{3} \approx 0.333}", r"\boxed{x = \frac{1}{3} \approx 1.3}"),
        ("5", r"\boxed{5}", r"\boxed{5 \text{ if } n \text{ even}, 6 \text{ otherwise}}"),
        ("11", r"\boxed{5 + 6}", r"\boxed{5 \quad 6}"),
        ("11", r"\boxed{11}", r"\boxed{5 \; (6)}"),
        ("5, 6", r"\boxed{5 \quad 6}", r"\boxed{5 \quad 7}"),
    ],
)
def test_false_relations_case_splits_and_juxtaposed_numbers(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


def test_a_case_split_with_one_value_is_that_value() -> None:
    assert score("5", r"\boxed{5 \text{ if } n \text{ even}, 5 \text{ otherwise}}") == 1.0
    assert grade("5", r"\boxed{5 \approx 6}").details["reason"] == "hedging"


def test_exactness_rules_still_hold() -> None:
    assert score(r"\frac{1}{2^{99}}", r"\boxed{\frac{1}{2^{98}}}") == 0.0
    assert score(r"\sqrt{2}", r"\boxed{1.4142}") == 0.0  # four decimals of an irrational
    assert score("1.4142", r"\boxed{1.4142}") == 1.0  # unless the gold is that decimal
    assert score(r"\frac{2}{3}", r"\boxed{0.6667}") == 0.0


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        (
            r"\begin{pmatrix}\frac{1}{3}\\ \frac{1}{5}\end{pmatrix}",
            r"\boxed{\begin{pmatrix}0.333333\\0.2\end{pmatrix}}",
            r"\boxed{\begin{pmatrix}0.33\\0.2\end{pmatrix}}",
        ),
        (r"(\frac{3}{5}, \frac{8}{3}]", r"\boxed{(0.6, 2.666667]}", r"\boxed{(0.6, 2.6667]}"),
        (r"(\frac{1}{3}, \sqrt{2})", r"\boxed{(0.333333, 1.41421)}", r"\boxed{(0.333333, 1.4142)}"),
        (r"\{\frac{1}{3}, \sqrt{2}\}", r"\boxed{\{1.41421, 0.333333\}}", r"\boxed{\{1.41421, 0.3333\}}"),
        (r"\frac{1}{3}", r"\boxed{x = 0.333333}", r"\boxed{x = 0.3333}"),
        (r"\frac{100}{3}\%", r"\boxed{33.3333\%}", r"\boxed{33.33\%}"),
    ],
)
def test_decimal_entries_approximate_by_the_same_digit_rule(gold: str, right: str, near_miss: str) -> None:
    both_ways(gold, right, near_miss)


def test_trailing_zeros_are_not_significant_digits() -> None:
    assert score(r"\pi", r"\boxed{3.14160}") == 0.0  # 3.1416: five digits
    assert score(r"\pi", r"\boxed{3.141590}") == 1.0
    assert score(r"123456 + \frac{\sqrt{2}}{2}", r"\boxed{123456.0}") == 0.0  # a whole number, not within 0.1


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        (
            r"\left(\frac{1}{3}, \frac{2}{3}\right)",
            r"\boxed{\left(\frac{1}{3}, \frac{2}{3}\right) \approx (0.33, 0.67)}",
            r"\boxed{\left(\frac{1}{3}, \frac{2}{3}\right) \approx (0.33, 1.67)}",
        ),
        (
            r"(\sqrt{2}, 2)",
            r"\boxed{(x, y) = (\sqrt{2}, 2) \approx (1.41, 2)}",
            r"\boxed{(x, y) = (\sqrt{2}, 2) \approx (1.41, 3)}",
        ),
        (
            r"\begin{pmatrix}\frac{1}{3}\\ 2\end{pmatrix}",
            r"\boxed{\begin{pmatrix}\frac{1}{3}\\ 2\end{pmatrix} \approx \begin{pmatrix}0.333\\ 2\end{pmatrix}}",
            r"\boxed{\begin{pmatrix}\frac{1}{3}\\ 2\end{pmatrix} \approx \begin{pmatrix}0.333\\ 2.5\end{pmatrix}}",
        ),
    ],
)
def test_approximations_of_tuples_and_vectors_are_checked_entry_by_entry(
    gold: str, right: str, near_miss: str
) -> None:
    both_ways(gold, right, near_miss)
    assert grade(gold, near_miss).details["reason"] == "hedging"


@pytest.mark.parametrize(
    ("gold", "right", "near_miss"),
    [
        ("[-2, 7)", r"\boxed{-2 \le x < 7}", r"\boxed{-2 < x < 7}"),
        (r"(\sqrt{2}, \infty)", r"\boxed{x > \sqrt{2}}", r"\boxed{x \ge \sqrt{2}}"),
        (r"(-\infty, 3]", r"\boxed{3 \ge x}", r"\boxed{3 > x}"),
        ("x > 3", r"\boxed{3 < x}", r"\boxed{x < 3}"),
        ("(-2, 2)", r"\boxed{x^2 < 4}", r"\boxed{x < 2}"),
        ("[-2, 7]", r"\boxed{7 \ge x \ge -2}", r"\boxed{7 \ge x > -2}"),
    ],
)
def test_inequalities_bounding_a_variable_are_the_intervals_they_allow(
    gold: str, right: str, near_miss: str
) -> None:
    both_ways(gold, right, near_miss)
