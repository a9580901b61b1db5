"""Reading a run spec's YAML: one clear line for every way a file can be wrong, and a key given twice refused; and
merging YAML with the flags (the flags win)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class SpecError(ValueError):
    """A user-caused configuration error; its message is one line."""


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a key given twice in one mapping (it would keep the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_yaml(path: Path | str) -> dict[str, Any]:
    p = Path(path)
    try:
        data = yaml.load(p.read_text(encoding="utf-8"), Loader=_UniqueKeyLoader)  # noqa: S506 (a safe loader)
    except FileNotFoundError:
        raise SpecError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise SpecError(f"{p}: is a directory; give a YAML file") from None
    except UnicodeDecodeError:
        raise SpecError(f"{p}: not a text file (not UTF-8); give a YAML file") from None
    except OSError as e:
        raise SpecError(f"{p}: cannot read it ({e.strerror or type(e).__name__})") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark else ""
        raise SpecError(f"{p}:{where} invalid YAML ({getattr(e, 'problem', None) or e})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise SpecError(f"{p}: top level must be a mapping of keys, got {type(data).__name__}")
    return data


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = deep_merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out
