"""Verifiable rewards for vision RL: answer parsers, pure score functions and the family registry."""

from rl.rewards.parsers import extract_answer, parse_boxes, parse_choice, parse_int, parse_number, parse_points
from rl.rewards.registry import REWARDS, RewardResult, compute_reward, get_reward, register_reward
from rl.rewards.scores import (
    box_iou_matrix,
    chart_value_reward,
    choice_reward,
    counting_reward,
    edit_distance,
    exact_reward,
    grounding_reward,
    ocr_reward,
    point_score_matrix,
    pointing_reward,
    soft_f1,
)

__all__ = [
    "REWARDS",
    "RewardResult",
    "box_iou_matrix",
    "chart_value_reward",
    "choice_reward",
    "compute_reward",
    "counting_reward",
    "edit_distance",
    "exact_reward",
    "extract_answer",
    "get_reward",
    "grounding_reward",
    "ocr_reward",
    "parse_boxes",
    "parse_choice",
    "parse_int",
    "parse_number",
    "parse_points",
    "point_score_matrix",
    "pointing_reward",
    "register_reward",
    "soft_f1",
]
