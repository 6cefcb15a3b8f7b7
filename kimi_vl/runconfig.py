"""Strict run configs: typed dataclasses filled from YAML files and ``key=value`` overrides.

Every stage (training, RL, evaluation, ablations) describes its settings as a dataclass tree. A run
config is a YAML mapping merged *strictly* into that tree:

- an unknown key, a value of the wrong type, or a missing required field raises :class:`ConfigError`
  naming the dotted key and where the value came from (the file, or ``command line``);
- ``key=value`` overrides use dotted keys for nesting (``optim.lr=3e-4``) and YAML syntax for values
  (``layers=[kda,mla]``, ``resume=null``);
- a YAML file may start from another one with ``_base_: other.yaml`` (relative to the file, else a shipped run
  config of ``kimi_vl/configs`` by name, e.g. ``_base_: tiny_pretrain``); keys of the derived file replace the
  base's, mappings merge recursively;
- :func:`save_config` writes the resolved config, which :func:`load_config` reads back unchanged.

Example::

    @dataclass
    class Optim:
        lr: float = 3e-4
        name: Literal["muonclip", "adamw"] = "muonclip"

    @dataclass
    class Run:
        output_dir: str              # required
        optim: Optim = field(default_factory=Optim)

    cfg = load_config(Run, "run.yaml", ["optim.lr=1e-3"])
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

T = TypeVar("T")
BASE_KEY = "_base_"
SHIPPED_CONFIGS = Path(__file__).resolve().parent / "configs"  # what a _base_ name that is not a file beside refers to
CLI_SOURCE = "command line"


class ConfigError(ValueError):
    """A run config could not be built; the message names the key and its source."""


def _describe(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _is_optional(tp: Any) -> bool:
    return get_origin(tp) in (Union, types.UnionType) and type(None) in get_args(tp)


def _coerce(value: Any, tp: Any, key: str, source: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and return it (ints widen to floats)."""

    def fail(why: str = "") -> ConfigError:
        got = f"{value!r} ({type(value).__name__})"
        return ConfigError(f"{key}: expected {_describe(tp)}, got {got} in {source}{why}")

    if tp is Any:
        return value
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in get_args(tp):
            return None
        for arg in get_args(tp):
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, key, source)
            except ConfigError:
                continue
        raise fail()
    if origin is Literal:
        if value in get_args(tp):
            return value
        raise fail(f"; allowed: {', '.join(map(repr, get_args(tp)))}")
    if origin in (list, tuple, Sequence) or tp in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise fail()
        args = get_args(tp)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(args) != len(value):
                raise fail(f"; expected {len(args)} items")
            items = [_coerce(v, a, f"{key}[{i}]", source) for i, (v, a) in enumerate(zip(value, args))]
            return tuple(items)
        elem = args[0] if args else Any
        items = [_coerce(v, elem, f"{key}[{i}]", source) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin in (dict, Mapping) or tp is dict:
        if not isinstance(value, Mapping):
            raise fail()
        kt, vt = get_args(tp) or (Any, Any)
        return {_coerce(k, kt, key, source): _coerce(v, vt, f"{key}.{k}", source) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        if isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise fail()
        return _build(tp, value, key, source)
    if tp is float:
        if isinstance(value, str):  # PyYAML reads `3e-4` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                raise fail() from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise fail()
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise fail()
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise fail()
        return value
    if tp is str:
        if not isinstance(value, str):
            raise fail()
        return value
    if isinstance(tp, type):
        if not isinstance(value, tp):
            raise fail()
        return value
    return value


def _build(cls: type[T], data: Mapping[str, Any], prefix: str, source: str | Mapping[str, str]) -> T:
    """Instantiate dataclass ``cls`` from ``data``; ``source`` may map dotted keys to their origin."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    for name in data:
        if name not in fields:
            dotted = f"{prefix}.{name}" if prefix else name
            known = ", ".join(sorted(fields))
            raise ConfigError(f"unknown key '{dotted}' in {_source_of(source, dotted)} (known keys here: {known})")
    kwargs = {}
    for name, f in fields.items():
        dotted = f"{prefix}.{name}" if prefix else name
        if name in data:
            kwargs[name] = _coerce_nested(data[name], hints[name], dotted, source)
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"missing required key '{dotted}' (set it in the YAML file or as {dotted}=...)")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        where = f" '{prefix}'" if prefix else ""
        raise ConfigError(f"invalid config{where} from {_blamed_source(source, prefix, data, str(exc))}: {exc}") \
            from exc


def _blamed_source(source: str | Mapping[str, str], prefix: str, data: Mapping[str, Any], message: str) -> str:
    """Where the value a dataclass check rejected came from: the origin of the longest key path the message names that
    leads to a value in ``data`` (a check in ``__post_init__`` names its field), else the section's."""
    if not isinstance(source, str):
        for word in sorted(set(re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", message)), key=len, reverse=True):
            node: Any = data
            for part in word.split("."):
                node = node.get(part) if isinstance(node, Mapping) else None
            if node is not None and not isinstance(node, Mapping):
                return _source_of(source, f"{prefix}.{word}" if prefix else word)
    return _source_of(source, prefix)


def _coerce_nested(value: Any, tp: Any, dotted: str, source: str | Mapping[str, str]) -> Any:
    inner = get_args(tp)[0] if _is_optional(tp) and len(get_args(tp)) == 2 else tp
    if dataclasses.is_dataclass(inner) and isinstance(value, Mapping):
        return _build(inner, value, dotted, source)
    return _coerce(value, tp, dotted, _source_of(source, dotted))


def _source_of(source: str | Mapping[str, str], dotted: str) -> str:
    if isinstance(source, str):
        return source
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        hit = source.get(".".join(parts[:i]))
        if hit is not None:
            return hit
    return source.get("", "defaults")


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> tuple[dict, dict[str, str]]:
    """Read a YAML file (following ``_base_``); return the data and the origin of every dotted key."""
    path = path.resolve()
    if path in seen:
        raise ConfigError(f"{BASE_KEY} cycle: {' -> '.join(map(str, seen + (path,)))}")
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"cannot parse {path}: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(data).__name__}")
    base = data.pop(BASE_KEY, None)
    merged: dict = {}
    origins: dict[str, str] = {}
    if base is not None:
        merged, origins = _read_yaml(_base_path(path, str(base)), seen + (path,))
    _deep_merge(merged, data, origins, str(path))
    return merged, origins


def _base_path(path: Path, base: str) -> Path:
    """``_base_`` of the file at ``path``: a file relative to it, else a shipped run config by name."""
    name = base if base.endswith((".yaml", ".yml")) else f"{base}.yaml"
    for beside in (path.parent / base, path.parent / name):
        if beside.is_file():
            return beside
    shipped = SHIPPED_CONFIGS / name
    return shipped if "/" not in base and shipped.is_file() else path.parent / base  # (missing: _read_yaml names it)


def _deep_merge(dst: dict, src: Mapping, origins: dict[str, str], source: str, prefix: str = "") -> None:
    for k, v in src.items():
        dotted = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, Mapping) and isinstance(dst.get(k), dict):
            _deep_merge(dst[k], v, origins, source, dotted)
        else:
            dst[k] = dict(v) if isinstance(v, Mapping) else v
            origins[dotted] = source
            for sub in [o for o in origins if o.startswith(dotted + ".")]:
                origins[sub] = source


def parse_override(text: str) -> tuple[list[str], Any]:
    """``"a.b=1e-3"`` -> (["a", "b"], 0.001); the value is parsed as YAML."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' on the {CLI_SOURCE} is not of the form key=value")
    key, raw = text.split("=", 1)
    key = key.strip().lstrip("-")
    if not key:
        raise ConfigError(f"override '{text}' on the {CLI_SOURCE} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.split("."), value


def apply_overrides(data: dict, overrides: Sequence[str], origins: dict[str, str]) -> None:
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            child = node.get(part)
            if not isinstance(child, dict):
                if child is not None:
                    raise ConfigError(f"override '{text}': '{part}' is not a mapping")
                child = node[part] = {}
                origins[".".join(path[: i + 1])] = CLI_SOURCE  # a section made here: an unknown one is blamed on it
            node = child
        node[path[-1]] = value
        origins[".".join(path)] = CLI_SOURCE


def load_config(
    cls: type[T],
    path: str | os.PathLike | None = None,
    overrides: Sequence[str] = (),
    defaults: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` from ``defaults``, then the YAML file at ``path``, then ``key=value`` overrides."""
    data: dict = {}
    origins: dict[str, str] = {"": "defaults"}
    if defaults:
        _deep_merge(data, defaults, origins, "defaults")
    if path is not None:
        file_data, file_origins = _read_yaml(Path(path))
        _deep_merge(data, file_data, origins, str(Path(path).resolve()))
        origins.update(file_origins)
    apply_overrides(data, overrides, origins)
    return _build(cls, data, "", origins)


def config_from_dict(cls: type[T], data: Mapping[str, Any], source: str = "dict") -> T:
    """Strictly build ``cls`` from a plain mapping (e.g. a config saved in a checkpoint)."""
    return _build(cls, data, "", source)


def to_dict(cfg: Any) -> Any:
    """Plain YAML-safe data for a config tree (tuples become lists)."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, Mapping):
        return {k: to_dict(v) for k, v in cfg.items()}
    return cfg


def save_config(cfg: Any, path: str | os.PathLike) -> Path:
    """Write the resolved config as YAML (atomically) and return the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    os.replace(tmp, path)
    return path


def replace_config(cfg: T, overrides: Sequence[str]) -> T:
    """Return a copy of ``cfg`` with ``key=value`` overrides applied strictly."""
    data = to_dict(cfg)
    origins: dict[str, str] = {"": "defaults"}
    apply_overrides(data, overrides, origins)
    return _build(type(cfg), data, "", origins)


__all__ = [
    "ConfigError",
    "apply_overrides",
    "config_from_dict",
    "load_config",
    "parse_override",
    "replace_config",
    "save_config",
    "to_dict",
]
