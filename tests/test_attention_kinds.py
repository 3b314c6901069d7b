"""Attention kinds through the whole application: the seven configs of the Primal paper's table
train, evaluate and are reported through the command line, each block labelled by its kind; the
configuration of kinds and its errors; runs and checkpoints from before kinds existed load and
resume as before; random features and hashes resume bit-identical; no attention breaks the
compiled graph."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import TINY, train_args
from test_reproducibility import fingerprint, start, train

from primal_dt.cli import main
from primal_dt.common.config import ModelConfig, load_config
from primal_dt.common.errors import ConfigError
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.registry import ATTENTIONS, attention_class, check_kinds
from primal_dt.store.integrity import DIGEST_KEY
from primal_dt.store.rundir import read_snapshot
from primal_dt.tools.report import paper_scores, read_run, spectrum_table

TABLE = list(paper_scores().columns)  # dt, linear-dt, ..., primal-dt
NEW_KEYS = ("attention", "performer_features", "performer_redraw", "reformer_buckets",
            "reformer_chunk", "reformer_hashes")  # fmt: skip


def test_the_papers_table_trains_evaluates_and_is_reported(minari_root, tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    args = ["sweep", "--tasks", "hopper-medium", "--seeds", "0", "--configs", ",".join(TABLE),
            "--runs-dir", str(runs), "--steps", "4", "--device", "cpu", "--offline",
            "--final-episodes", "1"]  # fmt: skip
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
        assert kinds[-1] == kind and (kinds == [kind] * 2 or config == "primal-dt"), config
        assert main(["eval", "--ckpt", str(run_dir / "ckpt.pt"), "--episodes", "1", "--json"]) == 0
        (record,) = json.loads(capsys.readouterr().out)
        assert "error" not in record and record["step"] == 4, config
        summaries.append(read_run(run_dir))
    table = spectrum_table(summaries)
    for label in (
        "softmax",
        "Primal",
        "Linear",
        "Reformer",
        "Performer",
        "cosFormer",
        "Flowformer",
    ):
        assert f"| {label} |" in table, label
    assert main(["report", str(runs)]) == 0
    report = (runs / "report" / "report.md").read_text()
    assert "Flowformer 66.9 ± 2.5" in report and "Linear 58.7 ± 0.4" in report


def test_kinds_per_block_and_their_errors() -> None:
    config = ModelConfig(n_layer=3, attention=["linear", "primal", "flowformer"])
    config.validate()
    assert config.block_kinds() == ["linear", "primal", "flowformer"]
    assert config.primal_indices() == [1]
    mixed = ModelConfig(n_layer=3, attention="cosformer", primal_blocks="last")
    assert mixed.block_kinds() == ["cosformer", "cosformer", "primal"]
    assert ModelConfig(n_layer=2).block_kinds() == ["softmax", "softmax"]  # as before kinds
    for bad, message in [
        ({"attention": ["linear"]}, "lists 1 kinds for 3 blocks"),
        ({"attention": ["linear"] * 3, "primal_blocks": "last"}, 'primal_blocks must be "none"'),
        ({"reformer_buckets": 5}, "model.reformer_buckets must be even"),
        ({"performer_redraw": -1}, "model.performer_redraw must be >= 0"),
    ]:
        with pytest.raises(ConfigError, match=message):
            ModelConfig(n_layer=3, **bad).validate()
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


def test_a_run_from_before_attention_kinds_loads_evaluates_and_resumes(
    minari_root, tmp_path, capsys
) -> None:
    """Its config.json and checkpoint lack every key this change added: it is the same softmax
    and Primal model, evaluates to the same result, and resumes."""
    run_dir = tmp_path / "old"
    assert main(train_args(run_dir, 4, 'model.primal_blocks="last"', "eval.final_episodes=0")) == 0
    checkpoint = run_dir / "ckpt.pt"
    eval_args = ["eval", "--ckpt", str(checkpoint), "--episodes", "1", "--json"]
    capsys.readouterr()
    assert main(eval_args) == 0
    (before,) = json.loads(capsys.readouterr().out)
    payload = torch.load(checkpoint, weights_only=True)
    for key in NEW_KEYS:
        del payload["config"]["model"][key]
    del payload[DIGEST_KEY]  # such a checkpoint also predates digests
    torch.save(payload, checkpoint)
    saved = json.loads((run_dir / "config.json").read_text())
    for key in NEW_KEYS:
        del saved["model"][key]
    (run_dir / "config.json").write_text(json.dumps(saved))
    snapshot = read_snapshot(checkpoint)
    assert snapshot.config.model.block_kinds() == ["softmax", "primal"]
    model = snapshot.build_model("cpu")
    assert set(model.state_dict()) == set(payload["model"])
    assert main(eval_args) == 0
    (after,) = json.loads(capsys.readouterr().out)
    assert after["results"] == before["results"]
    assert read_run(run_dir).block_kinds == ["softmax", "primal"]
    assert main(["train", "--resume", str(run_dir), "--steps", "6", "--no-progress"]) == 0
    assert read_snapshot(run_dir).step == 6


def test_random_features_and_hashes_resume_bit_identical(minari_root, tmp_path) -> None:
    """Performer's features (redrawn every 7 steps here) and Reformer's rotations (every step)
    are drawn from the step: a run stopped and resumed ends with the bits of one never stopped."""
    kinds = (
        'model.attention=["performer","reformer"]',
        'model.primal_blocks="none"',
        "model.performer_redraw=7",
    )
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    train(straight, 30, *kinds)
    train(stopped, 10, *kinds)
    process = start(["train", "--resume", str(stopped), "--steps", "30", "--no-progress"])
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    (weights_a, logged_a, evals_a), (weights_b, logged_b, evals_b) = (
        fingerprint(straight), fingerprint(stopped),
    )  # fmt: skip
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
    config = ModelConfig(embed_dim=32, n_layer=len(kinds), n_head=2, context_len=5,
                         attention=kinds, performer_features=16)  # fmt: skip
    model = DecisionTransformer(config, 4, 3, 100)
    batch, k = 3, 5
    mask = torch.ones(batch, k, dtype=torch.bool)
    mask[1, :2] = False
    inputs = (torch.randn(batch, k, 4), torch.randn(batch, k, 3), torch.randn(batch, k),
              torch.arange(k).repeat(batch, 1), mask)  # fmt: skip
    explained = torch._dynamo.explain(model)(*inputs)
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_a_new_kind_is_one_class_and_one_registry_line(monkeypatch) -> None:
    """What adding an eighth attention takes: its class, registered, and a config naming it."""
    base = attention_class("softmax")

    class Eighth(base):  # type: ignore[misc, valid-type]
        label = "Eighth"

    monkeypatch.setitem(ATTENTIONS, "eighth", Eighth)
    config = load_config(None, ['model.attention=["eighth","softmax"]', "model.n_layer=2"])
    model = DecisionTransformer(config.model, 3, 2, 10)
    assert isinstance(model.blocks[0].attn, Eighth) and model.blocks[0].kind == "eighth"
    from primal_dt.method.registry import attention_label

    assert attention_label("eighth") == "Eighth"
