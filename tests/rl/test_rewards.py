"""Every reward on hand-computed cases, empty predictions, duplicates; parsers; the registry's format check."""

import math

import numpy as np
import pytest

from rl.rewards import (
    box_iou_matrix,
    chart_value_reward,
    compute_reward,
    counting_reward,
    edit_distance,
    exact_reward,
    extract_answer,
    grounding_reward,
    ocr_reward,
    parse_boxes,
    parse_choice,
    parse_int,
    parse_number,
    parse_points,
    pointing_reward,
    register_reward,
    soft_f1,
)


def test_extract_answer_precedence():
    assert extract_answer("think <answer>1</answer> more <answer> 7 </answer>") == "7"
    assert extract_answer("reasoning\nAnswer: 12\n") == "12"
    assert extract_answer("  5 ") == "5"


def test_parsers():
    assert parse_number("1,024") == 1024.0
    assert parse_number("-3.5.") == -3.5
    assert parse_number("3 apples") is None and parse_number("") is None
    assert parse_int("4.0") == 4 and parse_int("4.5") is None
    assert parse_choice("(b)") == "B" and parse_choice("B.") == "B"
    assert parse_choice("E", num_options=4) is None and parse_choice("AB") is None
    assert parse_boxes("[1, 2, 3, 4]") == [[1, 2, 3, 4]]
    assert parse_boxes("[]") == []
    assert parse_boxes("[[3, 2, 1, 4]]") is None  # x1 > x2
    assert parse_boxes("[[1, 2, 3]]") is None and parse_boxes("not json") is None
    assert parse_points("[[0.5, 0.25], [1, 1]]") == [[0.5, 0.25], [1.0, 1.0]]


def test_counting_hand_cases():
    assert counting_reward(3, 3) == 1.0
    assert counting_reward(2, 3) == pytest.approx(1 - 1 / 3)
    assert counting_reward(9, 10) == pytest.approx(0.9)
    assert counting_reward(1, 0) == 0.0 and counting_reward(0, 0) == 1.0
    assert counting_reward(100, 3) == 0.0


def test_box_iou_hand_case():
    iou = box_iou_matrix([[0, 0, 2, 2]], [[1, 1, 3, 3], [0, 0, 2, 2], [5, 5, 6, 6]])
    np.testing.assert_allclose(iou, [[1 / 7, 1.0, 0.0]])


def test_grounding_soft_f1_hand_case():
    gt = [[0, 0, 2, 2], [10, 10, 12, 12]]
    # one exact, one with IoU 1/7: F1 = 2 * (1 + 1/7) / (2 + 2)
    assert grounding_reward([[10, 10, 12, 12], [1, 1, 3, 3]], gt) == pytest.approx(2 * (1 + 1 / 7) / 4)
    assert grounding_reward(gt, gt) == pytest.approx(1.0)


def test_grounding_assignment_is_optimal_not_greedy():
    # greedy on row 0 would take column 0 (0.9) leaving 0.0; optimum is 0.8 + 0.8
    s = np.array([[0.9, 0.8], [0.8, 0.0]])
    assert soft_f1(s) == pytest.approx(2 * 1.6 / 4)


def test_grounding_empty_and_duplicates():
    gt = [[0, 0, 2, 2]]
    assert grounding_reward([], gt) == 0.0
    assert grounding_reward(gt, []) == 0.0
    assert grounding_reward([], []) == 1.0
    # a duplicate matches only once: S = 1, n = 2, m = 1 -> 2/3
    assert grounding_reward(gt + gt, gt) == pytest.approx(2 / 3)


def test_pointing_gaussian():
    sigma = 2.0
    d = 2.0
    expected = math.exp(-(d**2) / (2 * sigma**2))
    assert pointing_reward([[3.0, 1.0]], [[1.0, 1.0]], sigma) == pytest.approx(expected)
    assert pointing_reward([[1.0, 1.0], [1.0, 1.0]], [[1.0, 1.0]], sigma) == pytest.approx(2 / 3)
    assert pointing_reward([], [[1.0, 1.0]], sigma) == 0.0
    with pytest.raises(ValueError, match="sigma"):
        pointing_reward([[0, 0]], [[0, 0]], 0.0)


def test_ocr_edit_distance():
    assert edit_distance("kitten", "sitting") == 3
    assert ocr_reward("kitten", "sitting") == pytest.approx(1 - 3 / 7)
    assert ocr_reward("", "") == 1.0 and ocr_reward("", "abc") == 0.0
    assert ocr_reward("hello   world ", "hello world") == 1.0
    assert ocr_reward("Hello", "hello") == pytest.approx(0.8)


def test_chart_value_relative_error():
    assert chart_value_reward(110.0, 100.0) == pytest.approx(0.9)
    assert chart_value_reward(-50.0, 100.0) == 0.0
    assert chart_value_reward(0.0, 0.0) == 1.0 and chart_value_reward(1.0, 0.0) == 0.0


def test_exact_and_choice():
    assert exact_reward("4.0", "4") == 1.0
    assert exact_reward(" Paris. ", "paris") == 1.0
    assert exact_reward("Lyon", "paris") == 0.0
    assert compute_reward("multiple_choice", "<answer>(c)</answer>", "C").reward == 1.0
    assert compute_reward("multiple_choice", "<answer>B</answer>", "C").reward == 0.0


@pytest.mark.parametrize(
    "family,response,gt",
    [
        ("counting", "three", 3),
        ("grounding", "<answer>box at left</answer>", [[0, 0, 1, 1]]),
        ("pointing", "[[1, 2, 3]]", [[1, 2]]),
        ("chart", "about a hundred", 100.0),
        ("multiple_choice", "<answer>the second</answer>", "B"),
        ("exact", "<answer></answer>", "x"),
    ],
)
def test_format_check_unparseable_gets_zero_and_is_flagged(family, response, gt):
    result = compute_reward(family, response, gt)
    assert result.reward == 0.0 and result.parsed is False


def test_registry_parsed_and_aliases():
    r = compute_reward("counting", "I see <answer>4</answer>", 5)
    assert r.parsed and r.reward == pytest.approx(0.8)
    register_reward("count_shapes", "counting")
    assert compute_reward("count_shapes", "5", 5).reward == 1.0
    with pytest.raises(ValueError, match="no reward registered"):
        compute_reward("nope", "1", 1)
