"""Attention kinds through the whole application: the seven configs of the Primal paper's table
train, evaluate and are reported through the command line, each block labelled by its kind; the
configuration of kinds and its errors; runs and checkpoints from before kinds existed load and
resume as before; random features and hashes resume bit-identical; no attention breaks the
compiled graph."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from conftest import TINY, train_args
from test_reproducibility import fingerprint, start, train

from primal_dt.cli import main
from primal_dt.common.config import ModelConfig
from primal_dt.common.errors import ConfigError
from primal_dt.common.loading import load_config
from primal_dt.method import registry
from primal_dt.method.layer import ProjectedAttention
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.registry import ATTENTIONS, check_kinds
from primal_dt.store.integrity import DIGEST_KEY
from primal_dt.store.snapshots import read_snapshot
from primal_dt.tools.paper import paper_scores
from primal_dt.tools.report_tables import spectrum_table
from primal_dt.tools.runs import read_run

TABLE = list(paper_scores().columns)  # dt, linear-dt, ..., primal-dt


def test_the_papers_table_trains_evaluates_and_is_reported(minari_root, tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    args = [
        "sweep",
        "--tasks",
        "hopper-medium",
        "--seeds",
        "0",
        "--configs",
        ",".join(TABLE),
        "--runs-dir",
        str(runs),
        "--steps",
        "4",
        "--device",
        "cpu",
        "--offline",
        "--final-episodes",
        "1",
    ]
    for setting in (*TINY, "eval.targets=[1800.0]"):
        args += ["--set", setting]
    assert main(args) == 0
    capsys.readouterr()
    expected_kinds = {"dt": "softmax", "primal-dt": "primal"}
    summaries = []
    for config in TABLE:
        run_dir = runs / "hopper-medium" / f"{config}-s0"
        kinds = read_snapshot(run_dir).config.model.block_kinds()
        kind = expected_kinds.get(config, config.removesuffix("-dt"))
        assert kinds[-1] == kind and (kinds == [kind] * 3 or config == "primal-dt"), config
        assert main(["eval", "--ckpt", str(run_dir / "ckpt.pt"), "--episodes", "1", "--json"]) == 0
        (record,) = json.loads(capsys.readouterr().out)
        assert "error" not in record and record["step"] == 4, config
        summaries.append(read_run(run_dir))
    table = spectrum_table(summaries)
    for cls in ATTENTIONS.values():
        assert f"| {cls.label} |" in table, cls.label
    assert main(["report", str(runs)]) == 0
    report = (runs / "report" / "report.md").read_text()
    assert "Flowformer 66.9 ± 2.5" in report and "Linear 58.7 ± 0.4" in report


def test_kinds_per_block_and_their_errors() -> None:
    config = ModelConfig(n_layer=3, attention=["linear", "primal", "flowformer"])
    config.validate()
    assert config.block_kinds() == ["linear", "primal", "flowformer"]
    assert config.blocks_of("primal") == [1]
    legacy = load_config(None, ['model.attention="cosformer"', 'model.primal_blocks="last"'])
    assert legacy.model.block_kinds() == ["cosformer", "cosformer", "primal"]  # the older form
    assert ModelConfig(n_layer=2).block_kinds() == ["softmax", "softmax"]  # as before kinds
    with pytest.raises(ConfigError, match="lists 1 kinds for 3 blocks"):
        ModelConfig(n_layer=3, attention=["linear"]).validate()
    with pytest.raises(ConfigError, match=r"model.primal_blocks \(its older form\) must be left"):
        load_config(
            None, ['model.attention=["linear","linear","linear"]', 'model.primal_blocks="last"']
        )
    # Each kind's settings: checked by the registry, one line naming the key.
    for kind, settings, message in [
        (
            "reformer",
            {"reformer": {"buckets": 5}},
            "model.attention_settings.reformer.buckets must be even",
        ),
        (
            "performer",
            {"performer": {"redraw": -1}},
            "model.attention_settings.performer.redraw must be >= 0, got -1",
        ),
        (
            "performer",
            {"performer": {"features": "many"}},
            "model.attention_settings.performer.features must be an integer, got 'many'",
        ),
        (
            "performer",
            {"performer": {"feature": 8}},
            "unknown setting model.attention_settings.performer.feature (did you mean 'features'?)",
        ),
        (
            "softmax",
            {"performer": {"features": 8}},
            "model.attention_settings.performer: no block uses performer",
        ),
        (
            "performer",
            {"perfomer": {"features": 8}},
            "model.attention_settings.perfomer: unknown attention 'perfomer' (did you mean ",
        ),
        (
            "softmax",
            {"softmax": {"heads": 2}},
            "model.attention_settings.softmax: softmax has no settings, got heads",
        ),
    ]:
        config = ModelConfig(attention=kind, attention_settings=settings)
        config.validate()
        with pytest.raises(ConfigError, match=re.escape(message)):
            check_kinds(config)
    # The older keys read as the settings they became, where a block has the kind.
    old = load_config(
        None,
        [
            'model.attention="reformer"',
            "model.reformer_chunk=3",
            "model.performer_features=9",
            "model.primal_rank=4",
        ],
    ).model
    assert old.attention_settings == {"reformer": {"chunk": 3}}
    with pytest.raises(ConfigError, match=r"unknown attention 'flowfromer' \(did you mean "):
        check_kinds(ModelConfig(attention="flowfromer"))
    with pytest.raises(ConfigError, match="unknown attention 'soft'"):
        DecisionTransformer(ModelConfig(attention=["softmax", "soft", "softmax"]), 3, 2, 10)
    # --set takes a list of kinds as TOML.
    parsed = load_config(None, ['model.attention=["performer","reformer","softmax"]'])
    assert parsed.model.block_kinds() == ["performer", "reformer", "softmax"]


def test_an_unknown_kind_is_one_line_and_writes_nothing(minari_root, tmp_path, capsys) -> None:
    run_dir = tmp_path / "run"
    assert main(train_args(run_dir, 2, 'model.attention="perfomer"')) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "did you mean 'performer'" in err, err
    assert not run_dir.exists()


# The [model] of checkpoints and config.json from before, as those versions wrote them (every
# key, each kind's settings with its defaults), for a Primal.+DT of three blocks.
OLDER_MODELS = {
    "before-kinds": {"primal_blocks": "last", "primal_rank": 8, "primal_init": "public"},
    "before-kinds-owned-settings": {
        "primal_blocks": "last",
        "primal_rank": 8,
        "primal_init": "public",
        "attention": "softmax",
        "performer_features": 256,
        "performer_redraw": 1000,
        "reformer_buckets": 8,
        "reformer_chunk": 16,
        "reformer_hashes": 4,
    },
}


@pytest.mark.parametrize("older", OLDER_MODELS)
def test_a_run_saved_by_an_older_version_loads_evaluates_and_resumes(
    minari_root, tmp_path, capsys, older: str
) -> None:
    """Its config.json and checkpoint carry [model] as an older version wrote it: it is the same
    softmax and Primal model, evaluates to the same result, and resumes."""
    run_dir = tmp_path / "old"
    assert main(train_args(run_dir, 4, "eval.final_episodes=0")) == 0
    checkpoint = run_dir / "ckpt.pt"
    eval_args = ["eval", "--ckpt", str(checkpoint), "--episodes", "1", "--json"]
    capsys.readouterr()
    assert main(eval_args) == 0
    (before,) = json.loads(capsys.readouterr().out)
    payload = torch.load(checkpoint, weights_only=True)
    model = payload["config"]["model"]
    assert model.pop("attention") == ["softmax", "softmax", "primal"]
    assert model.pop("attention_settings") == {"primal": {"rank": 8, "init": "public"}}
    model.update(OLDER_MODELS[older])
    train = payload["config"]["train"]
    train["ksvd_weight"] = train.pop("aux_weight")  # train.aux_weight's older name
    del payload[DIGEST_KEY]  # such a checkpoint also predates digests
    torch.save(payload, checkpoint)
    saved = json.loads((run_dir / "config.json").read_text())
    saved["model"] = model
    saved["train"]["ksvd_weight"] = saved["train"].pop("aux_weight")
    (run_dir / "config.json").write_text(json.dumps(saved))
    snapshot = read_snapshot(checkpoint)
    assert snapshot.config.model.block_kinds() == ["softmax", "softmax", "primal"]
    assert snapshot.config.model.attention_settings == {"primal": {"rank": 8, "init": "public"}}
    assert snapshot.config.train.aux_weight == train["ksvd_weight"]
    built = snapshot.build_model("cpu")
    assert set(built.state_dict()) == set(payload["model"])
    assert main(eval_args) == 0
    (after,) = json.loads(capsys.readouterr().out)
    assert after["results"] == before["results"]
    assert read_run(run_dir).block_kinds == ["softmax", "softmax", "primal"]
    assert main(["train", "--resume", str(run_dir), "--steps", "6", "--no-progress"]) == 0
    assert read_snapshot(run_dir).step == 6


def test_random_features_and_hashes_resume_bit_identical(minari_root, tmp_path) -> None:
    """Performer's features (redrawn every 7 steps here) and Reformer's rotations (every step)
    are drawn from the step: a run stopped and resumed ends with the bits of one never stopped."""
    kinds = (
        'model.attention=["performer","reformer","performer"]',
        "model.attention_settings.performer.redraw=7",
    )
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(straight, 30, *kinds)
    train(stopped, 10, *kinds)
    process = start(["train", "--resume", str(stopped), "--steps", "30", "--no-progress"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    (weights_a, logged_a, evals_a), (weights_b, logged_b, evals_b) = (
        fingerprint(straight),
        fingerprint(stopped),
    )
    assert {"blocks.0.attn.features", "blocks.1.attn.rotations"} <= set(weights_a)
    assert weights_a.keys() == weights_b.keys()
    for name, tensor in weights_a.items():
        assert torch.equal(tensor, weights_b[name]), name
    train_a = {t: p for t, p in logged_a.items() if t.startswith("train/")}
    assert train_a == {t: p for t, p in logged_b.items() if t.startswith("train/")}
    assert [e for e in evals_b if e[0] != 10] == evals_a  # the first run's final evaluation


def test_no_attention_breaks_the_compiled_graph() -> None:
    """torch.compile traces every kind's forward as one graph (dynamo's own count of breaks)."""
    kinds = list(ATTENTIONS)
    config = ModelConfig(
        embed_dim=32,
        n_layer=len(kinds),
        n_head=2,
        context_len=5,
        attention=kinds,
        attention_settings={"performer": {"features": 16}},
    )
    model = DecisionTransformer(config, 4, 3, 100)
    batch, k = 3, 5
    mask = torch.ones(batch, k, dtype=torch.bool)
    mask[1, :2] = False
    inputs = (
        torch.randn(batch, k, 4),
        torch.randn(batch, k, 3),
        torch.randn(batch, k),
        torch.arange(k).repeat(batch, 1),
        mask,
    )
    explained = torch._dynamo.explain(model)(*inputs)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


@dataclass(frozen=True)
class PrefixMeanSettings:
    """The toy kind's own settings, [model.attention_settings.prefix-mean]."""

    scale: float = 1.0  #: multiplies the mean

    def check(self) -> None:
        if self.scale <= 0:
            raise ValueError(f"scale must be > 0, got {self.scale}")


class PrefixMeanAttention(ProjectedAttention):
    """A toy eighth kind, as docs/development.md says to add one: each head's output is `scale`
    times the mean of the values of the real tokens at or before it (causal by construction)."""

    label = "prefix mean"
    settings_class = PrefixMeanSettings

    def __init__(self, embed_dim: int, n_head: int, dropout: float, scale: float) -> None:
        super().__init__(embed_dim, n_head, dropout)
        self.scale = scale

    @classmethod
    def from_config(cls, config: ModelConfig, settings: Any = None) -> PrefixMeanAttention:
        return cls(config.embed_dim, config.n_head, config.dropout, settings.scale)

    def forward(
        self, x: torch.Tensor, mask: torch.Tensor, rows: slice | None = None, objective: bool = True
    ) -> tuple[torch.Tensor, None]:
        _, _, v = self.heads(x)  # (B, H, L, d)
        real = mask.to(v.dtype)[:, None, :, None]
        y = self.scale * (v * real).cumsum(dim=2) / real.cumsum(dim=2).clamp(min=1.0)
        return self.output(y, rows), None


@pytest.fixture
def kinds_restored():
    """The registry as it was before the test, whatever the test registered."""
    before = dict(ATTENTIONS)
    yield
    ATTENTIONS.clear()
    ATTENTIONS.update(before)


def test_a_new_kind_is_one_class_that_registers_itself(kinds_restored) -> None:
    """What adding an eighth attention takes: its class (with its settings), marked with
    @register, and a config naming it; it is then built, checked and trained like the others."""
    registry.register("prefix-mean")(PrefixMeanAttention)
    with pytest.raises(ValueError, match="clashes with the registered 'prefix-mean'"):
        registry.register("prefix-mean")(PrefixMeanAttention)
    again = type("Again", (PrefixMeanAttention,), {"label": "softmax"})
    with pytest.raises(ValueError, match="label 'softmax'"):
        registry.register("softmax-again")(again)
    base = [
        "model.n_layer=2",
        "model.embed_dim=16",
        "model.n_head=2",
        "model.context_len=5",
        'model.attention=["softmax","prefix-mean"]',
    ]
    config = load_config(None, [*base, "model.attention_settings.prefix-mean.scale=2"])
    torch.manual_seed(0)
    model = DecisionTransformer(config.model, 4, 3, 100)
    layer = model.blocks[1].attn
    assert isinstance(layer, PrefixMeanAttention) and layer.scale == 2.0
    assert registry.attention_label("prefix-mean") == "prefix mean"
    # Its settings are checked by the registry like any kind's, each error naming the key.
    for setting, said in [
        ("scale=0.5", None),
        ("scale=-1", "model.attention_settings.prefix-mean.scale must be > 0, got -1.0"),
        ('scale="big"', "model.attention_settings.prefix-mean.scale must be a number"),
        (
            "scael=2",
            "unknown setting model.attention_settings.prefix-mean.scael (did you mean 'scale'?)",
        ),
    ]:
        bad = load_config(None, [*base, f"model.attention_settings.prefix-mean.{setting}"])
        if said is None:
            check_kinds(bad.model)
            continue
        with pytest.raises(ConfigError, match=re.escape(said)):
            check_kinds(bad.model)
    # It learns: a fixed batch's action loss falls, some windows left-padded as in training.
    states, actions = torch.randn(8, 5, 4), torch.rand(8, 5, 3) * 2 - 1
    returns, timesteps = torch.randn(8, 5), torch.arange(5).expand(8, 5)
    mask = torch.ones(8, 5, dtype=torch.bool)
    mask[:4, :2] = False
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(40):
        predicted, aux = model(states, actions, returns, timesteps, mask)
        loss = ((predicted - actions) ** 2)[mask].mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert aux.item() == 0.0  # no auxiliary loss of its own
    assert losses[-1] < 0.5 * losses[0], losses


def test_the_auxiliary_loss_is_named_by_its_kind(kinds_restored) -> None:
    """Training logs a model's auxiliary loss under its kind's name (train/ksvd_loss for Primal's),
    a generic one where kinds with different ones are mixed, and Primal's name, at zero, where no
    block has one (DT and Primal-DT plot on one chart)."""

    class WithLoss(PrefixMeanAttention):
        label = "prefix mean with a loss"
        aux_loss_name = "prefix_loss"

        def forward(self, x, mask, rows=None, objective=True):  # type: ignore[no-untyped-def]
            y, _ = super().forward(x, mask, rows, objective)
            return y, (x.square().mean(dim=(1, 2)) if objective else None)

    registry.register("prefix-loss")(WithLoss)
    for kinds, name in [
        (["softmax", "softmax"], "ksvd_loss"),
        (["softmax", "primal"], "ksvd_loss"),
        (["softmax", "prefix-loss"], "prefix_loss"),
        (["primal", "prefix-loss"], "aux_loss"),
    ]:
        config = ModelConfig(embed_dim=16, n_layer=2, n_head=2, context_len=5, attention=kinds)
        assert DecisionTransformer(config, 4, 3, 100).aux_loss_name == name, kinds
