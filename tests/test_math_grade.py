"""Grading math answers: equivalence classes, math-verify's known weaknesses, hedging, guards."""

from __future__ import annotations

import time

import pytest

from genesys.verifiers.math_grade import grade


def score(gold: str, completion: str) -> float | None:
    return grade(gold, completion).score


def reason(gold: str, completion: str) -> str:
    return grade(gold, completion).details["reason"]


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("1,000", "1000"),
        ("1000", "1{,}000"),
        (r"\frac{1}{2}", "0.5"),
        ("0.25", r"\frac14"),
        (r"1.5 \times 10^{3}", "1500"),
        ("2.5e-4", "0.00025"),
        (r"25\%", "0.25"),
        (r"25\%", "25"),
        (r"60^\circ", "60"),
        (r"12 \text{ cm}", "12"),
        ("12", r"12 \text{ cm}"),
        (r"\frac{2}{3}", r"0.\overline{6}"),
        ("3", r"\text{three}"),
        ("-3", "−3"),
        ("4", r"\mathbf{4}"),
        (r"\frac{5}{2}", r"2\frac{1}{2}"),
        (r"\emptyset", r"\varnothing"),
    ],
)
def test_equal_numbers_in_different_notations(gold: str, answer: str) -> None:
    assert score(gold, rf"\boxed{{{answer}}}") == 1.0


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("x^2 - 1", "(x-1)(x+1)"),
        (r"2\sqrt{2}", r"\sqrt{8}"),
        (r"\frac{\sqrt{3}}{2}", r"\sin\left(\frac{\pi}{3}\right)"),
        ("0.5x + 1", r"\frac{x}{2}+1"),
        ("3+4i", "4i+3"),
        (r"\frac{1+\sqrt{5}}{2}", r"\frac{\sqrt{5}+1}{2}"),
    ],
)
def test_equivalent_expressions(gold: str, answer: str) -> None:
    assert score(gold, rf"\boxed{{{answer}}}") == 1.0


def test_different_expressions_and_variables() -> None:
    assert score("2x + 3", r"\boxed{2y+3}") == 0.0
    assert score("3 + 2\\sqrt{2}", r"\boxed{3+\sqrt{2}}") == 0.0


def test_exact_rationals_compare_exactly() -> None:
    # math-verify's numeric path rounds both to zero and accepts these.
    assert score(r"\frac{1}{2004!}", r"\boxed{\frac{1}{2006!}}") == 0.0
    assert score(r"\frac{1}{2^{99}}", r"\boxed{\frac{1}{2^{98}}}") == 0.0
    assert score(r"\frac{1}{2004!}", r"\boxed{\frac{2005 \cdot 2006}{2006!}}") == 1.0
    assert score(r"\frac{1}{2^{99}}", r"\boxed{2^{-99}}") == 1.0
    assert score("2^{100}", r"\boxed{2^{100}+1}") == 0.0


def test_decimals_approximate_only_with_enough_digits() -> None:
    assert score(r"\pi", r"\boxed{3.14159}") == 1.0
    assert score(r"\pi", r"\boxed{3.14}") == 0.0
    assert score(r"\frac{1}{3}", r"\boxed{0.333333}") == 1.0
    assert score(r"\frac{1}{3}", r"\boxed{0.33}") == 0.0
    assert score(r"\frac{1}{10^{9}}", r"\boxed{0.000000}") == 0.0  # zero to six places is not 1e-9
    assert score(r"\frac{3}{8}", r"\boxed{0.38}") == 0.0


def test_bare_gold_equation_is_not_reduced_to_its_right_side() -> None:
    assert score("x^2+y^2=1", r"\boxed{(x-1)^2+(y-1)^2=1}") == 0.0
    assert score("x^2+y^2=1", r"\boxed{y^2 + x^2 = 1}") == 1.0
    assert score("x+y=6", r"\boxed{y = 6}") == 0.0


def test_equations_are_not_collapsed_to_zero_equals_zero() -> None:
    assert score("y = 2x + 1", r"\boxed{0 = 0}") == 0.0
    assert score("2+3=5", r"\boxed{1+1=2}") == 0.0
    assert score("5", r"\boxed{6 = 5}") == 0.0
    assert score("5", r"\boxed{7 - 2 = 5}") == 1.0


def test_equation_chains_state_their_last_member() -> None:
    assert score("x = 5", r"\boxed{x = 7 - 2 = 5}") == 1.0
    assert score("11", r"\boxed{x = 5 + 5 + 1 = 11}") == 1.0
    # math-verify's suite accepts this as 11; a chain states its last member only when every link holds.
    assert score("x = 11", r"\boxed{x = 5 + 5 + 1 = 7 = 11}") == 0.0
    assert score("11", r"\boxed{x = 5 + 5 = 11}") == 0.0
    assert score("5", r"\boxed{x = 5 + 5 + 1 = 11}") == 0.0
    assert score("7", r"\boxed{x = 5 + 5 + 1 = 7 = 11}") == 0.0
    assert score("5", r"\boxed{5 + 5 + 1 = 11}") == 0.0


def test_sets_of_numbers_are_not_numbers() -> None:
    assert reason("5", r"\boxed{\mathbb{Z}}") == "mismatch"
    assert score("5", r"\boxed{[4, 6]}") == 0.0
    assert score("5", r"\boxed{4 \le x \le 6}") == 0.0


def test_assignments_against_a_tuple_follow_their_variables() -> None:
    assert score("(2, 1)", r"\boxed{x = 2 \text{ and } y = 1}") == 1.0
    assert score("(2, 1)", r"\boxed{x = 1 \text{ and } y = 2}") == 0.0
    assert score("(2, 1)", r"\boxed{y = 2 \text{ and } x = 1}") == 0.0  # that is (x, y) = (1, 2)
    assert score("(2, 1)", r"\boxed{y = 1, x = 2}") == 1.0


def test_equations_and_assignments() -> None:
    assert score("2x", r"\boxed{f(x) = 2x}") == 1.0
    assert score("[1, 2)", r"\boxed{x \in [1,2)}") == 1.0
    assert score("x = 5", r"\boxed{5}") == 1.0
    assert score("5", r"\boxed{x = 5}") == 1.0
    assert score("y = 2x + 1", r"\boxed{2x - y + 1 = 0}") == 1.0
    assert score("y = 2x + 1", r"\boxed{y = 3x + 1}") == 0.0


def test_tuples_keep_order_and_sets_do_not() -> None:
    assert score("(2, 3)", r"\boxed{(2,3)}") == 1.0
    assert score("(2, 3)", r"\boxed{(3,2)}") == 0.0
    assert score(r"\{1, 2, 3\}", r"\boxed{\{3, 1, 2\}}") == 1.0
    assert score(r"\{1, 2, 3\}", r"\boxed{\{1, 2\}}") == 0.0
    assert score("1, 2", r"\boxed{x = 2 \text{ or } x = 1}") == 1.0


def test_intervals_keep_open_and_closed_ends() -> None:
    assert score("[1, 2)", r"\boxed{[1,2)}") == 1.0
    assert score("[1, 2)", r"\boxed{(1,2]}") == 0.0
    assert score(r"(3, \infty)", r"\boxed{x > 3}") == 1.0
    assert score(r"(3, \infty)", r"\boxed{x \ge 3}") == 0.0
    assert score(r"(-\infty, -1) \cup (1, \infty)", r"\boxed{(1,\infty)\cup(-\infty,-1)}") == 1.0


def test_matrices_infinity_and_constants() -> None:
    matrix = r"\begin{pmatrix} 1 & 2 \\ 3 & 4 \end{pmatrix}"
    assert score(matrix, rf"\boxed{{{matrix}}}") == 1.0
    assert score(matrix, r"\boxed{\begin{pmatrix} 1 & 3 \\ 2 & 4 \end{pmatrix}}") == 0.0
    assert score(r"\infty", r"\boxed{\infty}") == 1.0
    assert score(r"-\infty", r"\boxed{\infty}") == 0.0
    assert score("e^2", r"\boxed{e^{2}}") == 1.0
    assert score(r"\pi", r"\boxed{\frac{22}{7}}") == 0.0


def test_choice_given_with_its_value() -> None:
    assert score("C", r"\boxed{\text{(C)}\ 15}") == 1.0
    assert score(r"\textbf{(C)}", r"\boxed{(D) 15}") == 0.0


def test_vectors_tuples_and_the_imaginary_unit() -> None:
    column = r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}"
    assert score(column, r"\boxed{(1, 2)}") == 1.0
    assert score(column, r"\boxed{(2, 1)}") == 0.0
    assert score("(1, 2, 3)", r"\boxed{\langle 1, 2, 3 \rangle}") == 1.0
    assert score("-1", r"\boxed{e^{i\pi}}") == 1.0
    assert score("2", r"\boxed{2 \text{ and } 2}") == 1.0  # one answer stated twice is not hedging


def test_text_and_multiple_choice() -> None:
    assert score(r"\text{yes}", r"\boxed{\text{Yes}}") == 1.0
    assert score(r"\text{yes}", r"\boxed{\text{No}}") == 0.0
    assert score("(B)", r"\boxed{B}") == 1.0
    assert score("(B)", r"\boxed{D}") == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        r"It is $\boxed{5}$ or $\boxed{6}$.",
        r"$\boxed{4, 5, 6}$",
        r"$\boxed{\{5, 6\}}$",
        "The answer is 5 or 6.",
        r"$\boxed{5 \text{ or } 6}$",
        "**Answer:** $5$ or $6$",
    ],
)
def test_hedging_is_never_rewarded(completion: str) -> None:
    verdict = grade("5", completion)
    assert verdict.score == 0.0
    assert verdict.details["reason"] == "hedging"


def test_one_box_per_part_when_the_gold_has_several_values() -> None:
    assert score("5, 7", r"(a) $\boxed{5}$ (b) $\boxed{7}$") == 1.0
    assert score("5, 7", r"(a) $\boxed{5}$ (b) $\boxed{8}$") == 0.0
    assert score("1, 2", r"$\boxed{1}$, $\boxed{2}$, $\boxed{3}$") == 0.0


def test_repeated_or_equivalent_boxes_are_one_answer() -> None:
    assert score("5", r"First $\boxed{5}$, checked again: $\boxed{5}$.") == 1.0
    assert score(r"\frac{1}{2}", r"$\boxed{\frac{1}{2}}$, i.e. $\boxed{0.5}$") == 1.0


def test_empty_box_and_placeholders() -> None:
    assert (score("5", r"\boxed{}"), reason("5", r"\boxed{}")) == (0.0, "empty_answer")
    for completion in (r"\boxed{x}", r"\boxed{N}", r"\boxed{\text{answer}}", r"\boxed{?}"):
        assert (score("5", completion), reason("5", completion)) == (0.0, "placeholder")
    assert score("x", r"\boxed{x}") == 1.0  # a letter is fine when the gold is that letter


def test_think_content_never_counts() -> None:
    assert reason("36", r"<think>6 * 6 = 36, so \boxed{36}</think>") == "no_answer"
    assert score("24", r"<think>\boxed{24}</think> Dividing by 2: $\boxed{12}$.") == 0.0
    assert score("24", r"<think>try \boxed{12}</think> So $\boxed{24}$.") == 1.0


def test_pathological_answers_are_refused_quickly() -> None:
    started = time.perf_counter()
    assert reason("5", r"\boxed{2^{2^{2^{2^{2^{2}}}}}}") == "too_complex"
    assert reason("5", r"\boxed{10^{10^{10}}}") == "too_complex"
    assert reason("5", r"\boxed{" + "(" * 30 + "5" + ")" * 30 + "}") == "too_complex"
    assert reason("5", r"\boxed{" + "1+" * 600 + "1}") == "too_complex"
    assert time.perf_counter() - started < 5
    # A tower is still compared as written, never evaluated.
    assert score("2^{2^{2^{2^{2^{2}}}}}", r"\boxed{2^{2^{2^{2^{2^{2}}}}}}") == 1.0


def test_details_say_what_was_extracted_parsed_and_why() -> None:
    details = grade(r"\frac{1}{2}", r"So $\boxed{0.5}$.").details
    assert details["reason"] == "matched"
    assert details["extracted"] == "0.5"
    assert details["extracted_by"] == "boxed"
    assert details["gold_parsed"] == "1/2"
    assert details["answer_parsed"].startswith("0.5")
    assert grade("5", "no idea").details["reason"] == "no_answer"
    assert grade("5", r"\boxed{6}").details["reason"] == "mismatch"


def test_unusable_gold_is_an_error_not_a_wrong_answer() -> None:
    verdict = grade("  ", r"\boxed{5}")
    assert verdict.score is None
    assert verdict.error is not None and verdict.error.startswith("invalid_ground_truth")


@pytest.mark.parametrize(
    "gold", ["$5$", r"\boxed{5}", r"\(5\)", r"$\boxed{5}$", r"The answer is $\boxed{5}$."]
)
def test_gold_delimiters_are_optional(gold: str) -> None:
    assert score(gold, r"\boxed{5}") == 1.0


def test_grading_uses_no_alarm_signals_and_works_off_the_main_thread() -> None:
    # math-verify's own timeouts call signal.alarm, which fails outside the main thread.
    import signal
    import threading

    before = signal.getsignal(signal.SIGALRM)
    results: list[float | None] = []
    worker = threading.Thread(
        target=lambda: results.append(score(r"\frac{\sqrt{3}}{2}", r"\boxed{\sin(\pi/3)}"))
    )
    worker.start()
    worker.join()
    assert results == [1.0]
    assert signal.getsignal(signal.SIGALRM) is before


# --- numbers set apart by spacing, false chains, several choices -------------------------------------

SPACES = [
    r"\,", r"\:", r"\;", r"\!", r"\>", r"\ ", "~", r"\quad", r"\qquad", r"\enspace", r"\enskip",
    r"\thinspace", r"\medspace", r"\thickspace", r"\negthinspace", r"\negmedspace", r"\space",
    r"\hspace{1em}", r"\hspace*{2pt}", r"\hskip 1em", r"\mkern3mu", r"\kern 1pt", r"\phantom{0}",
    r"\text{ }", r"\text{}", r"\text{~}", r"\mbox{ }", r"\textrm{ }", r"\mathrm{ }", "\u00a0", "\u2009",
    "\u202f", "\u2003",
]  # fmt: skip


@pytest.mark.parametrize("space", SPACES)
@pytest.mark.parametrize("gold", ["56", "11", "30", "5", "6", "-1"])
def test_numbers_set_apart_by_any_space_are_never_one_number(space: str, gold: str) -> None:
    for completion in (rf"\boxed{{5{space}6}}", rf"\boxed{{5 {space} 6}}", rf"\boxed{{5{space}-6}}"):
        verdict = grade(gold, completion)
        assert (verdict.score, verdict.details["reason"]) == (0.0, "hedging"), (completion, verdict.details)


@pytest.mark.parametrize("space", SPACES)
def test_numbers_set_apart_by_space_are_a_list_where_the_gold_is_one(space: str) -> None:
    assert score("5, 6", rf"\boxed{{5{space}6}}") == 1.0
    assert score("5, 6", rf"\boxed{{5{space}7}}") == 0.0


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        (r"\frac{1}{6}", r"\frac{1}{2} \quad \frac{1}{3}"),
        (r"\sqrt{6}", r"\sqrt{2} \qquad \sqrt{3}"),
        ("12", r"(3) \quad (4)"),
        ("2", r"1 \text{ } (2)"),
    ],
)
def test_values_set_apart_by_a_wide_space_are_not_multiplied(gold: str, answer: str) -> None:
    assert reason(gold, rf"\boxed{{{answer}}}") == "hedging"


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("5000", "5,000"),
        ("1000", r"1\,000"),  # a thin space between groups of three digits separates thousands
        ("12345", r"12\thinspace 345"),
        ("12345", "12\u202f345"),
        ("1000", r"1\ 000"),
        (r"3\sqrt{2}", r"3\,\sqrt{2}"),  # a thin space between a number and a symbol is typography
        (r"2\pi", r"2\,\pi"),
        ("5", r"5~\text{cm}"),
        ("12", r"12 \quad \text{cm}"),
        (r"\frac{1}{2}", r"\frac{1}{2}"),
        (r"\frac{1}{2}", r"\frac 1 2"),  # TeX's own spacing of digit arguments
        ("3", r"\log_2 8"),  # a subscript is not a number of its own
        ("5", "x = 5"),
    ],
)
def test_honest_spacing_still_reads_as_written(gold: str, answer: str) -> None:
    assert score(gold, rf"\boxed{{{answer}}}") == 1.0


@pytest.mark.parametrize(
    ("gold", "answer"),
    [
        ("1000", r"1\quad 000"),  # wider spaces never separate thousands
        ("1000", r"1~000"),
        ("1000", r"1\text{ }000"),
        ("5600", r"5\,600\,0"),
    ],
)
def test_wide_spaces_are_not_thousands_separators(gold: str, answer: str) -> None:
    assert score(gold, rf"\boxed{{{answer}}}") == 0.0


@pytest.mark.parametrize(
    "chain",
    [
        "6 = 7 = 5",
        "x = 6 = 7 = 5",
        "x = 5 + 5 = 5",
        "5 = 6 - 1 = 4",
        "x = 2 + 2 = 6 - 1 = 5",
        "AB = 3 + 3 = 5",
        "5 = 5 = 6 = 5",
    ],
)
def test_a_false_chain_states_nothing(chain: str) -> None:
    assert score("5", rf"\boxed{{{chain}}}") == 0.0


@pytest.mark.parametrize(
    "chain", ["7 - 2 = 6 - 1 = 5", "x = 2 + 3 = 5", "a = b = 5", "AB = CD = 5", "x = \\frac{10}{2} = 5"]
)
def test_a_true_chain_states_its_last_member(chain: str) -> None:
    assert score("5", rf"\boxed{{{chain}}}") == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        r"\boxed{(A) (B) (C) (D) (E)}",
        r"\boxed{(A) or (B)}",
        "The answer is (A) or (B).",
        r"\boxed{\text{(A) or (B)}}",
        r"\boxed{(A) and (C)}",
        r"\boxed{\textbf{(A)}\ \textbf{(B)}}",
        r"\boxed{(A)(B)}",
        r"\boxed{A \text{ or } B}",
        r"\boxed{A or B}",
        r"\boxed{(A) 15 \quad (B) 20}",
    ],
)
def test_several_choices_are_no_choice(completion: str) -> None:
    verdict = grade("A", completion, "lenient")
    assert (verdict.score, verdict.details["reason"]) == (0.0, "hedging"), verdict.details


@pytest.mark.parametrize(
    "answer",
    ["(A)", "A", r"\text{(A)}", r"\textbf{(A)}", r"\mathrm{(A)}", r"(A)\ 15", r"\textbf{(A) } 15", "(A) (A)"],
)
def test_one_choice_however_written_is_that_choice(answer: str) -> None:
    assert score("A", rf"\boxed{{{answer}}}") == 1.0
    assert score("B", rf"\boxed{{{answer}}}") == 0.0


# --- answers too costly to decide --------------------------------------------------------------------

GCD_TERMS = "+".join([r"\gcd(p^{99999}, q^{99999})"] * 29)


def test_a_power_of_a_fraction_near_one_is_too_costly_to_evaluate() -> None:
    started = time.perf_counter()
    verdict = grade("e", r"\boxed{(1+10^{-30})^{10^{30}}}")
    assert (verdict.score, verdict.details["reason"]) == (0.0, "too_complex")
    assert "power with about 10^30" in verdict.details["why"]
    assert score("e", r"\boxed{(1+10^{-3})^{10^{3}}}") == 0.0  # small enough to decide: a plain mismatch
    assert time.perf_counter() - started < 60  # seconds, not the hours exact evaluation would take


def test_an_answer_not_decided_within_the_budget_is_wrong_with_the_reason() -> None:
    verdict = grade("5", rf"\boxed{{{GCD_TERMS}}}", cpu_budget=0.3)
    assert (verdict.score, verdict.error) == (0.0, None)
    assert verdict.details["reason"] == "too_complex"
    assert "not decided within 0.3 CPU seconds" in verdict.details["why"]


def test_an_undecided_answer_that_is_the_gold_as_written_is_right() -> None:
    gold = r"\gcd(p^{99999}, q^{99999}) + \gcd(p^{99998}, q^{99999})"
    assert (
        grade(gold, "\\boxed{3}").details["reason"] == "mismatch"
    )  # the gold (2) is parsed once, unbudgeted
    same = grade(gold, r"\boxed{\gcd(p^{99999},q^{99999})+\gcd(p^{99998},q^{99999})}", cpu_budget=0.05)
    assert (same.score, same.details["decided_by"]) == (1.0, "the gold as written")
    other = grade(gold, r"\boxed{\gcd(p^{99999},q^{99999})+\gcd(p^{99998},p^{99999})}", cpu_budget=0.05)
    assert (other.score, other.details["reason"]) == (0.0, "too_complex")


def test_a_gold_too_costly_to_parse_is_an_error() -> None:
    verdict = grade(GCD_TERMS.replace("99999", "99998"), r"\boxed{29}", cpu_budget=0.3)
    assert verdict.score is None
    assert verdict.error.startswith("invalid_ground_truth") and "too costly to parse" in verdict.error


@pytest.mark.parametrize(
    "completion",
    [
        "blah is 5 blah",
        "Numbers: 3, 9, 5",
        "x 18 answer 40 : 70 15 value blah + of + total of 5",
        "so we get\n#### of therefore 96 value total 42 y #### get 5",
        "Answer: blah 5 blah",
        "**Answer:** we of total 5 y",
        "the total is 5 . therefore the value",
    ],
)
def test_noise_earns_nothing_under_the_default_policy(completion: str) -> None:
    assert score("5", completion) == 0.0
