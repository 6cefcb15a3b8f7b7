"""Offline lm-eval task suites (``kimi_text``, ``kimi_vision``) written from the synthetic world's held-out split."""

from eval.tasks.writer import VISION_TASKS, SuiteSpec, write_suites

__all__ = ["VISION_TASKS", "SuiteSpec", "write_suites"]
