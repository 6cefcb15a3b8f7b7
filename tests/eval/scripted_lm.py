"""A stand-in lm-eval model for task tests: the test supplies the request types its task sends; any other request
type fails the test, naming what the task asked for."""

from __future__ import annotations

from collections.abc import Callable


def scripted_lm(loglikelihood: Callable | None = None, generate_until: Callable | None = None,
                multimodal: bool = False):
    """An ``lm_eval.api.model.LM`` whose ``loglikelihood`` / ``generate_until`` are the given functions of the
    request list; ``loglikelihood_rolling`` and any function not given raise ``AssertionError``."""
    from lm_eval.api.model import LM

    def unexpected(kind: str) -> Callable:
        def call(self, requests, disable_tqdm=False):
            raise AssertionError(f"this task test's model gets no {kind} requests, got {len(requests)}")
        return call

    def given(fn: Callable | None, kind: str) -> Callable:
        return unexpected(kind) if fn is None else (lambda self, requests, disable_tqdm=False: fn(requests))

    body = {"MULTIMODAL": multimodal, "loglikelihood": given(loglikelihood, "loglikelihood"),
            "loglikelihood_rolling": unexpected("loglikelihood_rolling"),
            "generate_until": given(generate_until, "generate_until")}
    return type("ScriptedLM", (LM,), body)()
