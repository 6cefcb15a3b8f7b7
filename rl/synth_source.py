"""RL prompts from the synthetic world (``data_pipelines.synth``): verifiable questions with images, video or text.

Training prompts come from the *train* split of a built dataset (its shards, so any dataset written by
``kimi-vl data synth`` or the ``synth:PRESET`` cache works); held-out prompts from the *eval* split
(:func:`data_pipelines.synth.tasks.eval_items`), whose sample seeds never meet the training ones.

A prompt is the user turn the SFT data uses (media parts first, then the question; text-world problems put
the scene description before the question), rendered with the tokenizer's chat format plus the assistant
generation header (:func:`data_pipelines.tokenizer.render_chat`). Each image / video placeholder is expanded to
the packer's block (:class:`data_pipelines.packing.Encoder` ``image_block`` / ``video_blocks``) and the pixels
come from the injected processor (``vision_encoder.processor.MoonViTProcessor``), so ``Prompt.media`` holds the
packed media keys of docs/INTERFACES.md.

Answer format: the SFT chats answer with the bare answer string (``"3"``, ``"red"``, ``"[120, 40, 380, 300]"``)
and then ``<|im_end|>``; responses are decoded without special tokens, and the reward parsers read the whole
stripped response when it has no ``<answer>`` tag, so the format check matches what SFT taught.

QA category -> reward family (:data:`CATEGORY_REWARDS`, registered as aliases in :mod:`rl.rewards`):
``count`` -> counting (|pred - gt| shaped), ``ocr`` -> 1 - normalised edit distance, ``grounding`` -> box soft F1,
``chart_value`` -> relative error for numbers (exact match for the "which category" questions), and exact
match for ``color``, ``shape``, ``spatial``, ``arithmetic``, ``motion`` and ``exact`` (user questions, see
``data_pipelines/convert.py``).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from data_pipelines.packing import Encoder
from data_pipelines.synth.tasks import TaskItem, dataset_families, eval_items
from data_pipelines.tokenizer import placeholder_ids, render_chat, special_ids
from rl.rewards import REWARDS, RewardResult, parsers, register_reward, scores
from rl.rollout import Prompt

CATEGORY_REWARDS = {
    "count": "counting",
    "color": "exact",
    "shape": "exact",
    "spatial": "exact",
    "ocr": "ocr",
    "chart_value": "chart_value",
    "arithmetic": "exact",
    "grounding": "grounding",
    "motion": "exact",
    "exact": "exact",  # questions of user datasets (data_pipelines.convert) that no other category fits
}
SOURCE_SUITES = {"vision": "vision", "text": "text"}
VIDEO_FPS = 2.0  # frames per second sampled from videos (the training loader's default)


def _chart_value(response: str, gt: Any, **_: Any) -> RewardResult:
    """Numbers: ``chart_value_reward`` (relative error); a label answer: exact match."""
    answer = parsers.extract_answer(response)
    if isinstance(gt, (int, float)):
        pred = parsers.parse_number(answer)
        return RewardResult(0.0, False) if pred is None else RewardResult(scores.chart_value_reward(pred, gt), True)
    return RewardResult(0.0, False) if not answer else RewardResult(scores.exact_reward(answer, str(gt)), True)


def register_category_rewards() -> None:
    """Register the QA categories as reward families (idempotent)."""
    if "chart_value" not in REWARDS:
        register_reward("chart_value", _chart_value)
    for category, family in CATEGORY_REWARDS.items():
        if category not in REWARDS:
            register_reward(category, family)


register_category_rewards()


def ground_truth(item: TaskItem) -> Any:
    """The typed ground truth the category's reward expects (ints, floats, ``[[x0, y0, x1, y1]]``, strings)."""
    if item.answer_type == "box":
        box = json.loads(item.answer)
        if len(box) != 4:
            raise ValueError(f"task {item.id}: box answer must have 4 numbers, got {item.answer!r}")
        return [[float(v) for v in box]]
    if item.answer_type == "int":
        value = int(item.answer)
        return value if item.category != "chart_value" else float(value)
    return item.answer


@dataclass
class ChatTokenizer:
    """What the RL loop needs from a chat tokenizer: pad id, the ids that end a response (``<|im_end|>`` and
    ``<|endoftext|>``), the ids never to sample (the media placeholders, which the model's forward would expect
    pixel values for), and decoding without special tokens."""

    tokenizer: Any

    def __post_init__(self) -> None:
        ids = special_ids(self.tokenizer)
        if ids.im_end < 0:
            raise ValueError("ChatTokenizer: the tokenizer has no <|im_end|> token (needed to end chat answers)")
        self.pad_token_id, self.eos_token_id = ids.pad, ids.im_end
        self.eos_ids = [ids.im_end] + ([ids.eos] if ids.eos >= 0 and ids.eos != ids.im_end else [])
        self.banned_ids = placeholder_ids(self.tokenizer)

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)


class PromptBuilder:
    """TaskItem -> :class:`Prompt`: chat rendering, media blocks and pixel values (``processor`` may be None for
    text-only items)."""

    def __init__(self, tokenizer: Any, processor: Any = None, geometry: Any = None):
        self.encoder = (Encoder(tokenizer, "sft") if geometry is None else
                        Encoder(tokenizer, "sft", image_geometry=geometry, video_geometry=geometry))
        self.processor = processor
        self._media: dict[str, dict[str, torch.Tensor]] = {}

    def prompt_ids(self, item: TaskItem) -> list[int]:
        ids: list[int] = []
        run = ""
        n_img = n_vid = 0
        for text, _, media in render_chat(item.messages(), train_on="none", add_generation_prompt=True):
            if media is None:
                run += text
                continue
            ids += self.encoder.text_ids(run)
            run = ""
            if media == "image":
                w, h = item.images[n_img].size
                ids += self.encoder.image_block(h, w)
                n_img += 1
            else:
                v = item.videos[n_vid]
                t, h, w = v.frames_THWC.shape[:3]
                ids += self.encoder.video_blocks(t, h, w, v.timestamps)
                n_vid += 1
        return ids + self.encoder.text_ids(run)

    def media(self, item: TaskItem) -> dict[str, torch.Tensor]:
        """Packed media of the item's sample (cached per sample: its questions share the pixels)."""
        if not item.images and not item.videos:
            return {}
        key = item.id.rsplit("#", 1)[0]
        if key not in self._media:
            if self.processor is None:
                raise ValueError(f"task {item.id} has images/video but no processor was given (a text-only model?)")
            out: dict[str, torch.Tensor] = {}
            if item.images:
                out["pixel_values"], out["image_grid_thw"] = self.processor.preprocess_images(item.images)
            if item.videos:
                pvs, grids = [], []
                for v in item.videos:
                    pv, grid, _ = self.processor.preprocess_video(v.frames_THWC, timestamps=v.timestamps)
                    pvs.append(pv)
                    grids.append(grid)
                out["pixel_values_videos"], out["video_grid_thw"] = torch.cat(pvs), torch.cat(grids)
            self._media[key] = out
        return self._media[key]

    def build(self, item: TaskItem) -> Prompt:
        if item.category not in CATEGORY_REWARDS:
            raise ValueError(f"task {item.id}: QA category {item.category!r} has no reward "
                             f"(known: {sorted(CATEGORY_REWARDS)})")
        return Prompt(self.prompt_ids(item), item.category, ground_truth(item), self.media(item), uid=item.id)


def train_items(root: str, suite: str, families: Sequence[str], categories: Sequence[str]) -> list[TaskItem]:
    """One TaskItem per question of the train split's samples of ``families`` (and ``categories``, if given)."""
    from data_pipelines.shards import decode_sample, iter_tar
    from data_pipelines.synth.build import split_shards

    stream = "vision" if suite == "vision" else "text"
    out: list[TaskItem] = []
    for shard in split_shards(root, "train", stream):
        for raw in iter_tar(shard):
            record = json.loads(raw["json"]) if "json" in raw else {}
            if record.get("family") not in families:
                continue
            dec = decode_sample(raw, video_fps=VIDEO_FPS)
            context = record.get("caption", "") if suite == "text" else ""
            for j, q in enumerate(record.get("qa", [])):
                if categories and q["category"] not in categories:
                    continue
                out.append(TaskItem(f"{dec['__key__']}#{j}", suite, record["family"], q["category"], q["question"],
                                    q["answer"], q["answer_type"], dec["images"], dec["videos"], context))
    return out


class SynthPromptSource:
    """Verifiable prompts of the synthetic world for the RL trainer (see the module docstring).

    ``suite``: ``"vision"`` (shapes, ocr, chart, document, video) or ``"text"`` (text_mirror, the text-RL
    control arm). ``families``: data families to use (empty: all of the suite); ``categories``: QA categories
    to keep (empty: all). Training prompts are drawn uniformly from the train-split questions; held-out prompts
    are the first ``n`` eval-split questions after a fixed shuffle (``seed``)."""

    def __init__(self, root: str, builder: PromptBuilder, suite: str = "vision", families: Sequence[str] = (),
                 categories: Sequence[str] = (), seed: int = 0):
        known = dataset_families(str(root), suite)
        unknown = sorted(set(families) - set(known))
        if unknown:
            raise ValueError(f"data.reward_families: {unknown} are not families of the {suite!r} suite "
                             f"(its families: {known}; the text arm needs data.source=text)")
        bad = sorted(set(categories) - set(CATEGORY_REWARDS))
        if bad:
            raise ValueError(f"data.categories: unknown QA categories {bad} (known: {sorted(CATEGORY_REWARDS)})")
        self.root, self.builder, self.suite, self.seed = str(root), builder, suite, seed
        self.data_families = list(families) or known
        self.categories = list(categories)
        self.pool = train_items(self.root, suite, self.data_families, self.categories)
        if not self.pool:
            raise ValueError(f"no training questions for families {self.data_families} and categories "
                             f"{self.categories or 'all'} in the train split of {root}")
        self.families = sorted({it.category for it in self.pool})

    def sample(self, n: int, rng: random.Random) -> list[Prompt]:
        return [self.builder.build(self.pool[rng.randrange(len(self.pool))]) for _ in range(n)]

    def heldout(self, n: int) -> list[Prompt]:
        items = [it for it in eval_items(self.root, self.suite, video_fps=VIDEO_FPS)
                 if it.family in self.data_families and (not self.categories or it.category in self.categories)]
        if not items:
            raise ValueError(f"no held-out questions for families {self.data_families} in the eval split of "
                             f"{self.root}")
        random.Random(self.seed).shuffle(items)
        return [self.builder.build(it) for it in items[:n]]


__all__ = ["CATEGORY_REWARDS", "ChatTokenizer", "PromptBuilder", "SynthPromptSource", "ground_truth",
           "register_category_rewards", "train_items"]
