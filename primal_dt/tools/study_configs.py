"""The configs of the repository's studies (scripts/results.py), made from configs/matched.toml as
TOML data: each attention in its last block (matched-<kind>), behaviour cloning (matched-bc), and
Primal's initialisations (matched-primal-<init>-init, and matched-primal itself for matched.toml's
own). Each is a config of its own name, so that the report sets them side by side, and each
differs from matched-softmax in one thing only. At the papers' budget (papers_budget.toml over
matched.toml's settings, for scripts/gpu_study.sh) they keep their names, in a folder of their own.
"""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from primal_dt.common.loading import named_config_path
from primal_dt.method.attention import PRIMAL_INITS

PAPERS_BUDGET = Path(__file__).with_name("papers_budget.toml")


def _write(out: Path, name: str, settings: dict[str, Any], budget: bool) -> Path:
    import tomli_w  # the studies' (the report extra): the package itself only reads TOML

    path = out / ("budget-configs" if budget else "configs") / f"{name}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(tomli_w.dumps(settings))
    return path


def _matched(kind: str, budget: bool = False) -> dict[str, Any]:
    """configs/matched.toml (with budget, papers_budget.toml's settings over it) with `kind` in the
    last block and only that kind's own settings (a table for a kind no block uses is refused)."""
    settings = tomllib.loads(named_config_path("matched").read_text())
    if budget:
        for table, values in tomllib.loads(PAPERS_BUDGET.read_text()).items():
            settings[table].update(values)
    model = settings["model"]
    model["attention"] = [*model["attention"][:-1], kind]
    own = model.get("attention_settings", {})
    model["attention_settings"] = {name: table for name, table in own.items() if name == kind}
    if not model["attention_settings"]:
        del model["attention_settings"]
    return settings


def matched_config(out: Path, kind: str, budget: bool = False) -> Path:
    """matched-<kind>: the matched config with `kind` in its last block."""
    return _write(out, f"matched-{kind}", _matched(kind, budget), budget)


def bc_config(out: Path, budget: bool = False) -> Path:
    """matched-bc: matched-softmax without return conditioning (model.return_conditioning =
    false): behaviour cloning with the same network, budget and data, so that the table says
    what sequence modelling with returns adds."""
    settings = _matched("softmax", budget)
    settings["model"]["return_conditioning"] = False
    return _write(out, "matched-bc", settings, budget)


def init_configs(out: Path) -> list[Path]:
    """The initialisations' study's configs, one per initialisation (PRIMAL_INITS): matched-primal
    itself for configs/matched.toml's own, so that its runs are the matched study's
    (study_reuse.py), and matched-primal-<init>-init for each other."""
    own = _matched("primal")["model"]["attention_settings"]["primal"]["init"]
    return [
        matched_config(out, "primal") if init == own else init_config(out, init)
        for init in PRIMAL_INITS
    ]


def init_config(out: Path, init: str) -> Path:
    """matched-primal-<init>-init: matched-primal with model.attention_settings.primal.init =
    init, so that the report sets the initialisations side by side with nothing else different."""
    settings = _matched("primal")
    settings["model"]["attention_settings"]["primal"]["init"] = init
    return _write(out, f"matched-primal-{init}-init", settings, False)
