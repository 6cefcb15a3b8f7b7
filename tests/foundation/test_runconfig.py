from dataclasses import dataclass, field
from typing import Literal

import pytest
import yaml

from kimi_vl.runconfig import ConfigError, load_config, replace_config, save_config


@dataclass
class Optim:
    name: Literal["muonclip", "adamw"] = "muonclip"
    lr: float = 3e-4
    betas: tuple[float, float] = (0.9, 0.95)


@dataclass
class Run:
    output_dir: str
    max_steps: int = 10
    layers: list[str] = field(default_factory=lambda: ["kda", "mla"])
    init_from: str | None = None
    optim: Optim = field(default_factory=Optim)


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return p


def test_yaml_then_overrides(tmp_path):
    p = write(tmp_path, "run.yaml", {"output_dir": "out", "optim": {"lr": 1}})
    cfg = load_config(Run, p, ["optim.name=adamw", "max_steps=5", "layers=[mla,mla,kda]", "init_from=ckpt",
                               "optim.lr=3e-4"])
    assert cfg.optim.lr == 3e-4 and isinstance(cfg.optim.lr, float)
    assert cfg.optim.name == "adamw" and cfg.max_steps == 5 and cfg.layers == ["mla", "mla", "kda"]
    assert cfg.init_from == "ckpt" and cfg.optim.betas == (0.9, 0.95)


def test_unknown_key_names_key_and_file(tmp_path):
    p = write(tmp_path, "bad.yaml", {"output_dir": "o", "optim": {"lrr": 1e-3}})
    with pytest.raises(ConfigError, match=r"optim\.lrr.*bad\.yaml"):
        load_config(Run, p)


def test_unknown_override_names_command_line(tmp_path):
    p = write(tmp_path, "ok.yaml", {"output_dir": "o"})
    with pytest.raises(ConfigError, match=r"'nope'.*command line"):
        load_config(Run, p, ["nope=1"])
    with pytest.raises(ConfigError, match=r"'nope'.*command line"):  # a section only the command line made
        load_config(Run, p, ["nope.deeper=1"])


def test_wrong_type_names_key_and_source(tmp_path):
    p = write(tmp_path, "t.yaml", {"output_dir": "o", "max_steps": "ten"})
    with pytest.raises(ConfigError, match=r"max_steps: expected int.*t\.yaml"):
        load_config(Run, p)
    with pytest.raises(ConfigError, match=r"optim\.name.*allowed"):
        load_config(Run, p, ["max_steps=1", "optim.name=sgd"])
    with pytest.raises(ConfigError, match="bool"):
        load_config(Run, p, ["max_steps=true"])
    with pytest.raises(ConfigError, match="optim.lr: expected float"):
        load_config(Run, p, ["max_steps=1", "optim.lr=fast"])


@dataclass
class Checked:
    optim: Optim = field(default_factory=Optim)
    steps: int = 1

    def __post_init__(self) -> None:
        if self.optim.lr <= 0:
            raise ValueError(f"optim.lr must be > 0, got {self.optim.lr}")
        if self.steps < 1:
            raise ValueError(f"steps must be >= 1, got {self.steps}")


def test_a_rejected_value_is_blamed_on_its_own_source(tmp_path):
    """A check in __post_init__ names its field: the error names where that value came from, not the section's
    first source (it used to say "from defaults" for a value given on the command line)."""
    p = write(tmp_path, "c.yaml", {"optim": {"name": "adamw"}, "steps": 0})
    with pytest.raises(ConfigError, match=r"from command line: optim\.lr must be > 0"):
        load_config(Checked, p, ["steps=2", "optim.lr=-1"])
    with pytest.raises(ConfigError, match=r"from .*c\.yaml: steps must be >= 1"):
        load_config(Checked, p)


def test_missing_required(tmp_path):
    p = write(tmp_path, "m.yaml", {"max_steps": 3})
    with pytest.raises(ConfigError, match="missing required key 'output_dir'"):
        load_config(Run, p)


def test_base_inheritance_and_round_trip(tmp_path):
    write(tmp_path, "base.yaml", {"output_dir": "base", "optim": {"lr": 0.5, "name": "adamw"}})
    p = write(tmp_path, "child.yaml", {"_base_": "base.yaml", "optim": {"lr": 0.25}})
    cfg = load_config(Run, p)
    assert cfg.output_dir == "base" and cfg.optim.lr == 0.25 and cfg.optim.name == "adamw"
    saved = save_config(cfg, tmp_path / "out" / "config.yaml")
    assert load_config(Run, saved) == cfg


def test_replace_config_is_strict():
    cfg = Run(output_dir="x")
    assert replace_config(cfg, ["optim.lr=0.1"]).optim.lr == 0.1
    with pytest.raises(ConfigError):
        replace_config(cfg, ["optim.bogus=1"])


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(Run, tmp_path / "nope.yaml")


def test_base_names_a_shipped_config(tmp_path):
    """``_base_: debug_pretrain`` in a user's file (no such file beside it) starts from the shipped run config; a file
    beside it of that name would win; a base that is neither is an error naming the path."""
    from kimi_vl.train.config import TrainConfig

    mine = write(tmp_path, "mine.yaml", {"_base_": "debug_pretrain", "max_steps": 3})
    cfg = load_config(TrainConfig, mine)
    assert cfg.max_steps == 3 and cfg.model.flavor == "debug" and cfg.stage == "pretrain"
    write(tmp_path, "debug_pretrain.yaml", {"_base_": "tiny_pretrain.yaml", "seed": 7})
    cfg = load_config(TrainConfig, mine)
    assert cfg.seed == 7 and cfg.model.flavor == "tiny" and cfg.max_steps == 3
    bad = write(tmp_path, "bad.yaml", {"_base_": "no_such_config"})
    with pytest.raises(ConfigError, match="config file not found: .*no_such_config"):
        load_config(TrainConfig, bad)
