"""The configuration reference, generated from the config dataclasses so that it cannot go stale.

`{config-reference}` renders, per section ([model], [train], [eval], [data]), every key with its
type, default and meaning: the type and default from the dataclass field, the meaning from the
field's `#:` comment in primal_dt/common/config.py (read by Sphinx's own source analyser, as
autodoc reads attribute comments); and after [model], each attention kind's own settings
([model.attention_settings.<kind>]) from the settings dataclass the kind declares, with the `#:`
comments of its module. A field without one is a build error, so a new key must say what it
means.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.errors import ExtensionError
from sphinx.pycode import ModuleAnalyzer
from sphinx.util.docutils import SphinxDirective

from primal_dt.common import config
from primal_dt.method.registry import ATTENTIONS


def field_rows(cls: type) -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) of each field of one config dataclass."""
    docs = ModuleAnalyzer.for_module(cls.__module__).find_attr_docs()
    rows = []
    for field in dataclasses.fields(cls):
        meaning = " ".join(line.strip() for line in docs.get((cls.__name__, field.name), []))
        if not meaning:
            raise ExtensionError(
                f"{cls.__name__}.{field.name} has no #: comment in {cls.__module__}"
            )
        if field.default_factory is not dataclasses.MISSING:
            default = repr(field.default_factory())
        else:
            default = repr(field.default)
        rows.append((field.name, str(field.type), default.replace("'", '"'), meaning))
    return rows


def _text(meaning: str) -> list[nodes.Node]:
    """A meaning as nodes: ``code`` as literals, the rest as text."""
    parts = re.split(r"``(.+?)``", meaning)
    return [
        nodes.literal(part, part) if odd else nodes.Text(part)
        for odd, part in zip(itertools.cycle((0, 1)), parts, strict=False)
        if part
    ]


def _table(rows: list[tuple[str, str, str, str]], prefix: str) -> nodes.table:
    """A docutils table of key, type, default and meaning (built as nodes, so that it renders the
    same in a MyST page and an RST one)."""
    group = nodes.tgroup(cols=4)
    for width in (22, 14, 14, 50):
        group += nodes.colspec(colwidth=width)
    head, body = nodes.thead(), nodes.tbody()
    head += _row([[nodes.Text(t)] for t in ("key", "type", "default", "meaning")])
    for key, kind, default, meaning in rows:
        body += _row(
            [
                [nodes.literal(text=prefix + key)],
                [nodes.literal(text=kind)],
                [nodes.literal(text=default)],
                _text(meaning),
            ]
        )
    group += head
    group += body
    table = nodes.table()
    table += group
    return table


def _row(cells: list[list[nodes.Node]]) -> nodes.row:
    row = nodes.row()
    for content in cells:
        entry, paragraph = nodes.entry(), nodes.paragraph()
        paragraph.extend(content)
        entry += paragraph
        row += entry
    return row


class ConfigReference(SphinxDirective):
    def run(self) -> list[nodes.Node]:
        found: list[nodes.Node] = []
        top = []
        for field in dataclasses.fields(config.Config):
            section = getattr(config.Config(), field.name)
            if dataclasses.is_dataclass(section):
                found += [
                    nodes.rubric(text=f"[{field.name}]"),
                    _table(field_rows(type(section)), f"{field.name}."),
                ]
                if field.name == "model":
                    found += _kind_settings()
            else:
                top.append(field.name)
        rows = [row for row in field_rows(config.Config) if row[0] in top]
        return [*found, nodes.rubric(text="top level"), _table(rows, "")]


def _kind_settings() -> list[nodes.Node]:
    """A table per attention kind that has settings of its own (method/registry.py)."""
    found: list[nodes.Node] = []
    for kind, cls in ATTENTIONS.items():
        if cls.settings_class is not None:
            key = f"model.attention_settings.{kind}"
            found += [
                nodes.rubric(text=f"[{key}]"),
                _table(field_rows(cls.settings_class), f"{key}."),
            ]
    return found


def setup(app: Sphinx) -> dict[str, bool]:
    app.add_directive("config-reference", ConfigReference)
    return {"parallel_read_safe": True}
