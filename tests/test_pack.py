"""Runs trained as one pack (training/pack.py): each the run it would be alone, each a whole run of
its own (checkpoints that eval and --resume read), the same bits however often the pack is stopped
and resumed, and `sweep --pack` planning and training packs."""

from __future__ import annotations

import signal
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import DEVICE, TINY, hopper_policy
from test_reproducibility import assert_same, start, stop_and_resume
from torch import Tensor
from torch.func import vmap

from primal_dt.cli import build_parser, main
from primal_dt.common.errors import ConfigError
from primal_dt.common.loading import load_config
from primal_dt.data.tasks import resolve_task
from primal_dt.evaluation.packed import PackedPolicy, score_pack
from primal_dt.evaluation.rollout import (
    EvalOptions,
    EvalPlan,
    evaluation_record,
    load_policy,
    plan_evaluation,
    score_targets,
)
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.registry import ATTENTIONS
from primal_dt.store.results import read_results
from primal_dt.store.rundir import RunDir, step_of
from primal_dt.store.snapshots import read_snapshot
from primal_dt.tools.grid import SweepOptions, group_packs, pack_command, pack_size, plan
from primal_dt.training.launch import resume_pack, start_pack, start_run, with_seeds
from primal_dt.training.step import StepSettings, update, warmup_schedule

FP32 = [*TINY, 'train.precision="fp32"', f'train.device="{DEVICE}"', 'eval.service="inline"']


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, a tensor's relative difference as a whole."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp(min=1e-30))


@pytest.mark.parametrize("kind", list(ATTENTIONS))
def test_a_run_in_a_pack_is_the_run_trained_alone(minari_root, tmp_path, kind) -> None:
    """In float32 on a CPU, after 40 steps (dropout on, warm-up and clipping in play; on CUDA
    without dropout) every
    parameter of each run of a pack of two is within 1e-5 relative of its lone run's, and its
    integer buffers (Performer's and Reformer's seeds) are equal: for every kind of the registry,
    in the last block, as the configs place it."""
    settings = [*FP32, f'model.attention=["softmax", "softmax", "{kind}"]', "train.steps=40"]
    if kind == "performer":  # its features redrawn within the 40 steps, as Reformer's every step
        settings.append("model.attention_settings.performer.redraw=7")
    if DEVICE != "cpu":  # on CUDA a pack's dropout masks are torch's, not its lone runs' (pack.py)
        settings.append("model.dropout=0.0")
    task = resolve_task("hopper-medium")
    config = load_config(None, settings)
    pack = start_pack(with_seeds(config, [0, 1]), task, [tmp_path / "p0", tmp_path / "p1"], "tiny")
    samplers = [trainer.sampler for trainer in pack.trainers]  # one copy of the dataset
    assert samplers[0].states.data_ptr() == samplers[1].states.data_ptr()
    assert samplers[0].generator is not samplers[1].generator
    pack.train(progress=False)
    for seed in (0, 1):
        alone = load_config(None, [*settings, f"train.seed={seed}"])
        start_run(alone, task, tmp_path / f"alone{seed}", "tiny").train(progress=False)
        packed = read_snapshot(tmp_path / f"p{seed}").weights
        lone = read_snapshot(tmp_path / f"alone{seed}").weights
        assert packed.keys() == lone.keys()
        for name, tensor in lone.items():
            if tensor.is_floating_point():
                assert relative_difference(packed[name], tensor) < 1e-5, (kind, seed, name)
            else:
                assert torch.equal(packed[name], tensor), (kind, seed, name)
    # The two runs of the pack are two runs, not one twice.
    first, second = (read_snapshot(tmp_path / f"p{seed}").weights for seed in (0, 1))
    assert not torch.equal(first["embed_state.weight"], second["embed_state.weight"])


def test_the_functional_update_is_clip_grad_norm_and_torchs_adamw() -> None:
    """step.update (S2, S3) on given gradients gives what clip_grad_norm_, torch's AdamW and the
    warm-up schedule give, over updates inside and after the warm-up; and vmapped over a pack,
    each run's with its own learning rate."""
    gen = torch.Generator().manual_seed(0)
    shapes = [(4, 5), (7,)]
    start = [torch.randn(shape, generator=gen) for shape in shapes]
    grads = [[torch.randn(shape, generator=gen) * 0.3 for shape in shapes] for _ in range(6)]
    settings = StepSettings("fp32", torch.device("cpu"), 0.25, 3, "ksvd_loss")

    def torch_path(lr: float) -> list[Tensor]:
        params = [torch.nn.Parameter(p.clone()) for p in start]
        optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.1)
        scheduler = warmup_schedule(optimizer, 3)
        for step_grads in grads:
            for param, g in zip(params, step_grads, strict=True):
                param.grad = g.clone()
            torch.nn.utils.clip_grad_norm_(params, 0.25)
            optimizer.step()
            scheduler.step()
        return [param.detach() for param in params]

    def functional(
        lr: Tensor,
        params: list[Tensor],
        moments: list[Tensor],
        squares: list[Tensor],
        count: Tensor,
        step_grads: list[Tensor],
    ) -> Tensor:
        count.add_(1)
        return update(params, step_grads, moments, squares, count, lr, torch.tensor(0.1), settings)

    lrs = torch.tensor([1e-2, 3e-3])
    params = [torch.stack([p.clone(), p.clone()]) for p in start]
    moments = [torch.zeros_like(p) for p in params]
    squares = [torch.zeros_like(p) for p in params]
    count = torch.zeros(())
    for step_grads in grads:
        stacked = [torch.stack([g, g]) for g in step_grads]
        vmap(functional, in_dims=(0, 0, 0, 0, None, 0))(
            lrs, params, moments, squares, count, stacked
        )
    for run, lr in enumerate(lrs.tolist()):
        for got, want in zip(params, torch_path(lr), strict=True):
            torch.testing.assert_close(got[run], want, rtol=1e-5, atol=1e-6)


PACK_SETTINGS = [
    *TINY,
    "train.ckpt_every=10",
    "train.eval_every=20",
    "eval.episodes=1",
    "eval.final_episodes=1",
    'train.precision="bf16"',
]
STEPS = 60


def pack_args(runs_dir: Path, steps: int = STEPS) -> list[str]:
    args = ["train", "--env", "hopper-medium", "--offline", "--no-progress", "--seeds", "0,1"]
    args += ["--runs-dir", str(runs_dir), "--steps", str(steps), "--device", DEVICE]
    args += ["--config", "primal-dt"]
    for setting in PACK_SETTINGS:
        args += ["--set", setting]
    return args


def run_dirs(runs_dir: Path) -> list[Path]:
    return [runs_dir / "hopper-medium" / f"primal-dt-s{seed}" for seed in (0, 1)]


@pytest.fixture(scope="module")
def straight_pack(minari_root, tmp_path_factory) -> Path:
    runs_dir = tmp_path_factory.mktemp("straight-pack")
    process = start(pack_args(runs_dir))
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 0, output
    return runs_dir


def test_a_pack_stopped_and_resumed_many_times_ends_bit_identical(straight_pack, tmp_path) -> None:
    """SIGINT, SIGKILL and SIGTERM at random moments after checkpoints, each followed by
    `train --resume` of the pack's run directories: every run ends with the bits, the logged
    scalars and the evaluations of the pack that was never stopped."""
    runs = run_dirs(tmp_path)
    kills = [signal.SIGINT, signal.SIGKILL, signal.SIGTERM]
    resume = ["train", "--resume", *map(str, runs), "--no-progress"]
    stopped = stop_and_resume(pack_args(tmp_path), runs[1], resume, kills, STEPS, seed=3)
    assert len(stopped) >= 2, f"the pack ended after only {[s for s, _ in stopped]}: too few stops"
    for name, output in stopped:
        if name != "SIGKILL":
            assert f"--resume {runs[0]} {runs[1]}" in output  # the command that continues it
    for straight, resumed in zip(run_dirs(straight_pack), runs, strict=True):
        assert_same(straight, resumed)


def test_a_packed_run_is_a_whole_run(straight_pack, tmp_path, capsys) -> None:
    """Each run of a pack has its own config.json, events, eval.jsonl and checkpoints; `eval`
    reads its checkpoint, and `train --resume` continues it alone."""
    first, second = run_dirs(straight_pack)
    for run_dir, seed in ((first, 0), (second, 1)):
        assert read_snapshot(run_dir).config.train.seed == seed
        assert (run_dir / "config.json").is_file() and list(run_dir.glob("events.out.*"))
        finals = [r for r in read_results(RunDir(run_dir)) if r.final]
        assert [r.step for r in finals] == [STEPS]
        assert {r.pack for r in read_results(RunDir(run_dir))} == {2}  # evaluated as one
        assert [r.step for r in read_results(RunDir(run_dir)) if not r.final] == [20, 40]
    assert main(["eval", "--ckpt", str(second), "--episodes", "1", "--device", DEVICE]) == 0
    assert "hopper-medium" in capsys.readouterr().out
    import shutil

    alone = tmp_path / "alone"
    shutil.copytree(second, alone, ignore=shutil.ignore_patterns(".*.lock"))
    assert main(["train", "--resume", str(alone), "--steps", str(STEPS + 5), "--no-progress"]) == 0
    assert read_snapshot(alone).step == STEPS + 5


def test_runs_that_cannot_be_packed_are_refused_in_one_line(minari_root, tmp_path) -> None:
    task = resolve_task("hopper-medium")
    config = load_config(None, [*FP32, "train.steps=10"])
    start_pack([config], task, [tmp_path / "a"], "tiny").train(progress=False)
    other = load_config(None, [*FP32, "train.steps=10", "train.batch_size=8"])
    start_run(other, task, tmp_path / "b", "tiny").train(progress=False)
    with pytest.raises(ConfigError, match=r"cannot be packed with .*train\.batch_size is 8"):
        resume_pack([tmp_path / "a", tmp_path / "b"], steps=20)
    start_run(load_config(None, [*FP32, "train.steps=5"]), task, tmp_path / "c", "tiny").train(
        progress=False
    )
    with pytest.raises(ConfigError, match="at step 5 .* at step 10"):
        resume_pack([tmp_path / "a", tmp_path / "c"], steps=20)
    with pytest.raises(ConfigError, match="seeds must differ"):
        start_pack(with_seeds(config, [1, 1]), task, [tmp_path / "d", tmp_path / "e"], "tiny")
    assert not (tmp_path / "d").exists()


def test_pack_options_that_do_not_go_together_get_one_line(minari_root, tmp_path, capsys) -> None:
    """As a user types them: each a single `primal-dt: error:` line saying what to do, exit 2,
    and no run directory made."""
    base = ["train", "--env", "hopper-medium", "--offline", "--no-progress", "--device", DEVICE]
    cases = {
        ("--seeds", "0,1", "--seed", "3"): "give it without --seed and --run-dir",
        ("--seeds", "0,1", "--run-dir", str(tmp_path / "x")): "--runs-dir DIR puts them",
        ("--seeds", ",", "--runs-dir", str(tmp_path / "r")): "--seeds is empty",
        ("--runs-dir", str(tmp_path / "r")): "--runs-dir places the runs of --seeds",
    }
    for args, expected in cases.items():
        assert main([*base, *args]) == 2, args
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("primal-dt: error:"), lines
        assert expected in lines[0], lines
    assert not (tmp_path / "r").exists() and not (tmp_path / "x").exists()


def test_sweep_packs_runs_of_one_task_and_config(tmp_path) -> None:
    """--pack N groups the runs that differ only in their seed, N at most per pack, and the
    pack's command line parses back to the cells' seeds, runs directory and settings."""
    options = SweepOptions(
        ["hopper-medium"],
        [0, 1, 2],
        ["dt", "primal-dt"],
        runs_dir=tmp_path / "runs",
        steps=10,
        device="cpu",
        offline=True,
        overrides=list(TINY),
        pack=2,
    )
    cells = plan(options)
    packs = group_packs(cells, pack_size(options, cells, cuda_here=False))
    assert [[(c.config, c.seed) for c in pack] for pack in packs] == [
        [("dt", 0), ("dt", 1)],
        [("primal-dt", 0), ("primal-dt", 1)],
        [("dt", 2)],
        [("primal-dt", 2)],
    ]
    args = build_parser().parse_args(pack_command(packs[1], options)[3:])
    assert (args.env, args.config, args.seeds) == ("hopper-medium", "primal-dt", "0,1")
    assert args.runs_dir == str((tmp_path / "runs").resolve()) and args.run_dir is None
    assert not any(setting.startswith("train.seed") for setting in args.set)
    # On a CPU no packs unless asked; on CUDA every seed of a task and config in one pack.
    options.pack = None
    assert pack_size(options, cells, cuda_here=True) == 1  # train.device = "cpu"
    automatic = [replace(cell, device="auto") for cell in cells]
    assert pack_size(options, automatic, cuda_here=False) == 1
    assert pack_size(options, automatic, cuda_here=True) == 3


def test_sweep_trains_packs(minari_root, tmp_path, capsys) -> None:
    runs = tmp_path / "runs"
    args = ["sweep", "--tasks", "hopper-medium", "--configs", "dt", "--seeds", "0,1"]
    args += ["--pack", "2", "--steps", "10", "--device", DEVICE, "--offline"]
    args += ["--runs-dir", str(runs)]
    for setting in TINY:
        args += ["--set", setting]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "packs: 2 runs in 1 packs (hopper-medium x dt: 2)" in out
    for seed in (0, 1):
        assert read_snapshot(runs / "hopper-medium" / f"dt-s{seed}").step == 10
    log = (runs / "hopper-medium" / "dt-s1" / "train.log").read_text()
    assert "trained in a pack" in log


def test_runs_of_a_pack_may_differ_in_their_values(minari_root, tmp_path) -> None:
    """Learning rate, weight decay, auxiliary weight and return conditioning are values the step
    takes per run: a pack of runs that differ in them gives each its lone run (float32, 20
    steps), the first here a behaviour-cloning one."""
    task = resolve_task("hopper-medium")
    base = [*FP32, "train.steps=20"]
    if DEVICE != "cpu":
        base.append("model.dropout=0.0")
    values = [
        ("train.lr=1e-4", "train.aux_weight=0.05", "model.return_conditioning=false"),
        ("train.lr=3e-4", "train.weight_decay=0.01", "train.aux_weight=0.2"),
    ]
    configs = [
        load_config(None, [*base, *v, f"train.seed={seed}"]) for seed, v in enumerate(values)
    ]
    pack = start_pack(configs, task, [tmp_path / "p0", tmp_path / "p1"], "tiny")
    pack.train(progress=False)
    for seed, config in enumerate(configs):
        start_run(config, task, tmp_path / f"alone{seed}", "tiny").train(progress=False)
        packed = read_snapshot(tmp_path / f"p{seed}")
        lone = read_snapshot(tmp_path / f"alone{seed}").weights
        assert packed.config.train.lr == config.train.lr
        for name, tensor in lone.items():
            if tensor.is_floating_point():
                assert relative_difference(packed.weights[name], tensor) < 1e-5, (seed, name)


def test_a_compiled_pack_steps_as_the_eager_pack(minari_root, tmp_path) -> None:
    """train.compile in a pack: the vmapped whole step compiled as one graph gives the eager
    pack's weights (float32, 3 steps, one Primal block so that the compile is short)."""
    task = resolve_task("hopper-medium")
    settings = [*FP32, "train.steps=3", "model.n_layer=1", 'model.attention=["primal"]']
    if DEVICE != "cpu":
        settings.append("model.dropout=0.0")
    weights = {}
    for compiled in (False, True):
        config = load_config(None, [*settings, f"train.compile={'true' if compiled else 'false'}"])
        dirs = [tmp_path / f"{compiled}{seed}" for seed in (0, 1)]
        start_pack(with_seeds(config, [0, 1]), task, dirs, "tiny").train(progress=False)
        weights[compiled] = [read_snapshot(d).weights for d in dirs]
    for eager, compiled in zip(weights[False], weights[True], strict=True):
        for name, tensor in eager.items():
            if tensor.is_floating_point():
                assert relative_difference(compiled[name], tensor) < 1e-5, name


def test_a_pack_is_rolled_out_with_one_forward_a_step_and_each_runs_lone_returns(
    monkeypatch,
) -> None:
    """Three runs' policies, each with its own seed's episodes, in one vector environment: one
    batched forward per environment step for all 18 episodes, and each run's returns its lone
    rollout's (float32: to the rounding of batched products), a behaviour-cloning run's too."""
    policy, task = hopper_policy()
    policies = [policy]
    for seed, conditioned in ((1, False), (2, True)):  # run 1 clones behaviour
        torch.manual_seed(seed)
        config = replace(policy.model.config, return_conditioning=conditioned)
        policies.append(replace(policy, model=DecisionTransformer(config, 11, 3, 1000)))
    packed = PackedPolicy.of(policies)
    batches: list[int] = []
    act = PackedPolicy.act
    monkeypatch.setattr(
        PackedPolicy,
        "act",
        lambda self, *windows: batches.append(len(windows[0])) or act(self, *windows),
    )
    plans = [EvalPlan(3, seed, (3600.0, 1800.0), False, 0, 0) for seed in (10, 20, 30)]
    found = score_pack(packed, task, plans)
    longest = max(int(r.lengths.max()) for results in found for r in results)
    assert batches == [18] * longest
    for alone_policy, asked, results in zip(policies, plans, found, strict=True):
        alone = score_targets(alone_policy, task, asked.episodes, asked.seed, asked.targets)
        for got, want in zip(results, alone, strict=True):
            np.testing.assert_array_equal(got.lengths, want.lengths)
            np.testing.assert_allclose(got.returns, want.returns, rtol=1e-6, atol=1e-6)
    assert not np.allclose(found[0][0].returns, found[2][0].returns)  # three runs, not one
    np.testing.assert_array_equal(found[1][0].returns, found[1][1].returns)  # targets unread
    with pytest.raises(ValueError, match="differ in more than their weights"):
        PackedPolicy.of([policy, replace(policy, return_scale=1.0)])


@pytest.mark.parametrize("service", ["inline", "process"])
def test_a_pack_is_evaluated_as_one_into_each_runs_records(minari_root, tmp_path, service) -> None:
    """Each evaluation step's snapshots of the pack's runs rolled out together, inline or in the
    pack's one process beside training: each run's eval.jsonl holds its own records (marked with
    the pack's size), whose returns are those of its checkpoint evaluated alone (float32)."""
    settings = [*FP32, f'eval.service="{service}"', "train.steps=40", "train.eval_every=20"]
    task = resolve_task("hopper-medium")
    config = load_config(None, [*settings, "eval.final_episodes=2"])
    runs = [tmp_path / "p0", tmp_path / "p1"]
    start_pack(with_seeds(config, [0, 1]), task, runs, "tiny").train(progress=False)
    finals = []
    for run in runs:
        records = read_results(RunDir(run))
        assert [(r.step, r.final, r.pack) for r in records] == [(20, False, 2), (40, True, 2)]
        snapshot = read_snapshot(run)
        policy = load_policy(snapshot, torch.device(DEVICE), "the final checkpoint")
        alone = evaluation_record(snapshot, policy, plan_evaluation(snapshot, EvalOptions()), "")
        for got, want in zip(records[-1].results, alone.results, strict=True):
            # CUDA's batched kernels round otherwise than its single ones, and an episode carries
            # the difference further: there the returns agree to 1e-3.
            close = 1e-6 if DEVICE == "cpu" else 1e-3
            assert got.return_mean == pytest.approx(want.return_mean, rel=close)
        finals.append(records[-1].results[0].return_mean)
    assert finals[0] != finals[1]


def test_a_packs_queues_are_taken_a_step_at_a_time_with_every_run_that_queued_it(
    tmp_path, monkeypatch
) -> None:
    """A step is evaluated once every run has queued it, or some run a later one (the others
    never will), or when finishing; never before a step still waiting; files go once done."""
    from types import SimpleNamespace

    from primal_dt.evaluation import packed

    runs = [RunDir(tmp_path / f"r{r}") for r in range(2)]
    groups: list[tuple[int, list[str]]] = []
    monkeypatch.setattr(packed, "read_snapshot", lambda path, map_location: path)
    monkeypatch.setattr(
        packed,
        "evaluate_together",
        lambda evs, paths, names: groups.append((step_of(paths[0]), names)) or [],
    )
    evaluators: list = [SimpleNamespace(run=run, device="cpu") for run in runs]

    def queue(run: int, step: int) -> None:
        runs[run].queue.mkdir(parents=True, exist_ok=True)
        runs[run].queued(step).write_bytes(b"")

    queue(0, 20)
    packed.evaluate_queues(evaluators, finishing=False)
    assert groups == [] and runs[0].queued(20).exists()  # the other run has not queued it yet
    queue(1, 20)
    queue(0, 40)
    packed.evaluate_queues(evaluators, finishing=False)
    assert groups == [(20, [str(runs[0]), str(runs[1])])]  # 40 waits for run 1
    queue(0, 60)  # run 1 never queued 40 (a resumed run that had it): 60 says it never will
    packed.evaluate_queues(evaluators, finishing=False)
    assert groups[1:] == [(40, [str(runs[0])])]
    packed.evaluate_queues(evaluators, finishing=True)
    assert groups[2:] == [(60, [str(runs[0])])]
    assert not runs[0].queued_snapshots() and not runs[1].queued_snapshots()
