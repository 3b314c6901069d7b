"""The Decision Transformer (primal_dt/method/model.py's docstring) with softmax, Primal, the other
attentions of the registry, or mixed attention blocks.

Checked through the whole model: causality at the timestep level (and inside a timestep: a_t is
predicted before a_t is seen), independence from padded steps, the KSVD loss (zero without Primal
blocks, else the mean over Primal blocks of mean_B(J^2)), and the model configuration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor

from primal_dt.common.config import ModelConfig
from primal_dt.common.errors import ConfigError
from primal_dt.common.loading import load_config, named_config_path
from primal_dt.method.attention import PrimalAttention, SoftmaxAttention
from primal_dt.method.model import DecisionTransformer
from primal_dt.method.registry import ATTENTIONS, check_settings_by_task

STATE_DIM, ACT_DIM, MAX_T, K, BATCH = 5, 3, 50, 6, 3
PRIMAL_CHOICES = ["none", "last", "all", [0]]
IDS = ["none", "last", "all", "first"]
# The other kinds, each in every block, and one mixture of three kinds.
OTHER_KINDS = [kind for kind in ATTENTIONS if kind not in ("softmax", "primal")]
MIXED = ["flowformer", "primal", "reformer"]
MODELS = PRIMAL_CHOICES + OTHER_KINDS + [MIXED]
MODEL_IDS = IDS + OTHER_KINDS + ["mixed"]


# Small settings for the kinds that have them.
SETTINGS = {
    "primal": {"rank": 8},
    "performer": {"features": 16},
    "reformer": {"buckets": 4, "chunk": 4, "hashes": 2},
}


def block_kinds(blocks: str | list[int] | list[str], n_layer: int = 3) -> str | list[str]:
    """model.attention for blocks: an attention kind for every block, a list of kinds, one per
    block; or which blocks are Primal, softmax elsewhere ("none", "last", "all" or indices)."""
    if isinstance(blocks, list) and blocks and isinstance(blocks[0], str):
        return list(blocks)  # type: ignore[arg-type]
    if isinstance(blocks, str) and blocks in OTHER_KINDS:
        return blocks
    named = {"none": [], "last": [n_layer - 1], "all": list(range(n_layer))}
    primal = named[blocks] if isinstance(blocks, str) else blocks
    return ["primal" if i in primal else "softmax" for i in range(n_layer)]


def make_model(blocks: str | list[int] | list[str], seed: int = 0) -> DecisionTransformer:
    """A small model whose blocks are block_kinds(blocks), each kind with SETTINGS."""
    torch.manual_seed(seed)
    attention = block_kinds(blocks)
    used = set([attention] if isinstance(attention, str) else attention)
    config = ModelConfig(
        embed_dim=32,
        n_layer=3,
        n_head=2,
        dropout=0.1,
        context_len=K,
        attention=attention,
        attention_settings={kind: own for kind, own in SETTINGS.items() if kind in used},
    )
    config.validate()
    return DecisionTransformer(config, STATE_DIM, ACT_DIM, MAX_T).eval()


def make_batch(seed: int = 1, mask: Tensor | None = None) -> dict[str, Tensor]:
    gen = torch.Generator(torch.get_default_device()).manual_seed(seed)
    return {
        "states": torch.randn(BATCH, K, STATE_DIM, generator=gen),
        "actions": torch.rand(BATCH, K, ACT_DIM, generator=gen) * 2 - 1,
        "returns_to_go": torch.randn(BATCH, K, generator=gen),
        "timesteps": torch.randint(0, MAX_T - K, (BATCH, 1), generator=gen) + torch.arange(K),
        "mask": torch.ones(BATCH, K, dtype=torch.bool) if mask is None else mask,
    }


def left_padding_mask() -> Tensor:
    mask = torch.ones(BATCH, K, dtype=torch.bool)
    mask[1, :2] = False
    mask[2, : K - 1] = False  # one real step
    return mask


def predict(model: DecisionTransformer, batch: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
    with torch.no_grad():
        return model(**batch)


def resample(batch: dict[str, Tensor], where: Tensor, gen: torch.Generator) -> dict[str, Tensor]:
    """A copy of batch with new states, actions, returns-to-go and timesteps where (B, K) is true."""
    new = {name: value.clone() for name, value in batch.items()}
    n = int(where.sum())
    new["states"][where] = 5 * torch.randn(n, STATE_DIM, generator=gen)
    new["actions"][where] = torch.rand(n, ACT_DIM, generator=gen) * 2 - 1
    new["returns_to_go"][where] = 5 * torch.randn(n, generator=gen)
    new["timesteps"][where] = torch.randint(0, MAX_T, (n,), generator=gen)
    return new


# ------------------------------------------------------------------------------ causality


@pytest.mark.parametrize("primal_blocks", MODELS, ids=MODEL_IDS)
def test_later_timesteps_do_not_change_earlier_predictions(primal_blocks) -> None:
    model = make_model(primal_blocks)
    batch = make_batch()
    predicted, _ = predict(model, batch)
    assert predicted.shape == (BATCH, K, ACT_DIM)
    gen = torch.Generator(torch.get_default_device()).manual_seed(2)
    for t in range(K - 1):
        later = torch.zeros(BATCH, K, dtype=torch.bool)
        later[:, t + 1 :] = True
        new_predicted, _ = predict(model, resample(batch, later, gen))
        torch.testing.assert_close(
            new_predicted[:, : t + 1], predicted[:, : t + 1], atol=1e-6, rtol=0
        )
        # Control: the resampled steps' predictions do change.
        assert (new_predicted[:, t + 1 :] - predicted[:, t + 1 :]).abs().max() > 1e-5


@pytest.mark.parametrize("primal_blocks", MODELS, ids=MODEL_IDS)
def test_action_at_t_is_not_seen_by_its_own_prediction(primal_blocks) -> None:
    model = make_model(primal_blocks)
    batch = make_batch()
    predicted, _ = predict(model, batch)
    gen = torch.Generator(torch.get_default_device()).manual_seed(3)
    for t in range(K):
        new = {name: value.clone() for name, value in batch.items()}
        new["actions"][:, t] = torch.rand(BATCH, ACT_DIM, generator=gen) * 2 - 1
        new_predicted, _ = predict(model, new)
        torch.testing.assert_close(
            new_predicted[:, : t + 1], predicted[:, : t + 1], atol=1e-6, rtol=0
        )
        if t < K - 1:  # control: a_t is seen by the next prediction
            assert (new_predicted[:, t + 1] - predicted[:, t + 1]).abs().max() > 1e-5
    # Control: the state s_t is seen by the prediction at t.
    new = {name: value.clone() for name, value in batch.items()}
    new["states"][:, 2] += 3.0
    new_predicted, _ = predict(model, new)
    assert (new_predicted[:, 2] - predicted[:, 2]).abs().max() > 1e-5


# -------------------------------------------------------------------------------- padding


@pytest.mark.parametrize("primal_blocks", MODELS, ids=MODEL_IDS)
def test_padded_steps_change_neither_predictions_nor_ksvd_loss(primal_blocks) -> None:
    model = make_model(primal_blocks)
    mask = left_padding_mask()
    batch = make_batch(mask=mask)
    predicted, ksvd = predict(model, batch)
    assert torch.isfinite(predicted).all()
    assert torch.isfinite(ksvd)
    gen = torch.Generator(torch.get_default_device()).manual_seed(4)
    for _ in range(3):
        new_predicted, new_ksvd = predict(model, resample(batch, ~mask, gen))
        torch.testing.assert_close(new_predicted[mask], predicted[mask], atol=1e-6, rtol=0)
        torch.testing.assert_close(new_ksvd, ksvd, atol=1e-7, rtol=1e-6)
    # Control: the same change with the mask off does change the predictions at real steps.
    unmasked = {**batch, "mask": torch.ones_like(mask)}
    changed = resample(unmasked, ~mask, gen)
    changed_predicted, _ = predict(model, changed)
    reference, _ = predict(model, unmasked)
    assert (changed_predicted[mask] - reference[mask]).abs().max() > 1e-5


def test_left_padding_gives_finite_gradients() -> None:
    model = make_model("all").train()
    mask = left_padding_mask()
    batch = make_batch(mask=mask)
    predicted, ksvd = model(**batch)
    loss = (predicted - batch["actions"])[mask].pow(2).mean() + 0.05 * ksvd
    loss.backward()
    for name, param in model.named_parameters():
        if param.grad is not None:
            assert torch.isfinite(param.grad).all(), name


# ------------------------------------------------------------------------------ KSVD loss


def test_without_return_conditioning_the_returns_reach_nothing() -> None:
    """model.return_conditioning = false (behaviour cloning, the same network): predictions and
    their gradients do not depend on the returns-to-go; with it they do."""
    batch = make_batch()
    changed = {**batch, "returns_to_go": batch["returns_to_go"] * 5 + 3}
    for conditioning in (True, False):
        model = make_model("last")
        model.config.return_conditioning = conditioning
        same = torch.equal(predict(model, batch)[0], predict(model, changed)[0])
        assert same != conditioning


def test_ksvd_loss_is_zero_without_primal_blocks() -> None:
    model = make_model("none")
    _, ksvd = predict(model, make_batch())
    assert isinstance(ksvd, Tensor)
    assert ksvd.shape == ()
    assert torch.equal(ksvd, torch.zeros(()))


@pytest.mark.parametrize("primal_blocks", ["last", "all", [0], [2, 0]], ids=str)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_ksvd_loss_is_mean_over_primal_blocks_of_mean_j_squared(primal_blocks, padded) -> None:
    model = make_model(primal_blocks)
    js: list[Tensor] = []

    def keep_j(module, inputs, output) -> None:
        y, j_squared = output  # a Primal layer's auxiliary loss per sequence: J^2
        assert j_squared.shape == (BATCH,)
        js.append(j_squared.sqrt())

    primal = [m for m in model.modules() if isinstance(m, PrimalAttention)]
    assert len(primal) == len(model.config.blocks_of("primal"))
    handles = [m.register_forward_hook(keep_j) for m in primal]
    try:
        _, ksvd = predict(model, make_batch(mask=left_padding_mask() if padded else None))
    finally:
        for handle in handles:
            handle.remove()
    assert len(js) == len(primal)
    expected = torch.stack([j.pow(2).mean() for j in js]).mean()
    assert ksvd.shape == ()
    assert ksvd.item() > 0
    torch.testing.assert_close(ksvd, expected, atol=1e-7, rtol=1e-6)


def test_ksvd_loss_reaches_primal_parameters() -> None:
    model = make_model("last")
    _, ksvd = model(**make_batch())
    ksvd.backward()
    attn = model.blocks[2].attn
    for param in (attn.we, attn.wr, attn.lam):
        assert param.grad is not None and param.grad.abs().max() > 0


# ---------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("primal_blocks", "expected"),
    [("none", []), ("last", [2]), ("all", [0, 1, 2]), ([2, 0, 2], [0, 2]), ([1], [1])],
    ids=["none", "last", "all", "list-dup", "middle"],
)
def test_older_primal_blocks_read_as_the_kinds_they_stand_for(primal_blocks, expected) -> None:
    """model.primal_blocks, the older way to say which blocks are Primal, still reads as the list
    of kinds it stands for, with the older model.primal_rank as Primal's rank."""
    base = ["model.embed_dim=32", "model.n_layer=3", "model.n_head=2", f"model.context_len={K}"]
    legacy = [f"model.primal_blocks={json.dumps(primal_blocks)}", "model.primal_rank=8"]
    config = load_config(None, [*base, *legacy]).model
    assert config.blocks_of("primal") == expected
    assert config.block_kinds() == ["primal" if i in expected else "softmax" for i in range(3)]
    assert config.attention_settings == ({"primal": {"rank": 8}} if expected else {})
    model = DecisionTransformer(config, STATE_DIM, ACT_DIM, MAX_T)
    for i, block in enumerate(model.blocks):
        if i in expected:
            assert isinstance(block.attn, PrimalAttention), i
            assert block.attn.we.shape == (2, 16, 8)
        else:
            assert isinstance(block.attn, SoftmaxAttention), i


def test_older_primal_blocks_last_follows_n_layer() -> None:
    last = load_config(None, ['model.primal_blocks="last"', "model.n_layer=5"]).model
    assert last.blocks_of("primal") == [4]
    every = load_config(None, ["model.n_layer=1", 'model.primal_blocks="all"']).model
    assert every.blocks_of("primal") == [0]


def test_a_kinds_settings_per_task_apply_where_a_block_has_it_and_no_set_gives_them(
    tmp_path,
) -> None:
    """configs/primal-dt.toml's per-dataset rank: the task's where a block is Primal, the file's
    rank for a task it does not list, none for a model without a Primal block, and --set's (by the
    key, its table or the older key) over the task's. An older config's [primal_rank_by_task]
    reads as the same table."""

    def rank(task: str | None, *overrides: str, path: Path | None = None) -> int | None:
        config = load_config(path or named_config_path("primal-dt"), list(overrides), task=task)
        return config.model.attention_settings.get("primal", {}).get("rank")

    assert rank("hopper-medium") == 96 and rank("halfcheetah-medium-replay") == 32
    assert rank("hopper-bundled") == rank(None) == 64  # not listed: the file's
    assert rank("hopper-medium", 'model.attention="softmax"') is None
    assert rank("hopper-medium", "model.attention_settings.primal.rank=8") == 8
    assert rank("hopper-medium", "model.attention_settings.primal={rank=8}") == 8
    assert rank("hopper-medium", "model.primal_rank=8") == 8
    assert rank("hopper-medium", 'model.attention_settings.primal.init="per-head"') == 96
    older = tmp_path / "older.toml"
    older.write_text('[model]\nattention = "primal"\n\n[primal_rank_by_task]\nhopper-medium = 24\n')
    assert rank("hopper-medium", path=older) == 24 and rank("walker2d-medium", path=older) is None
    config = load_config(older, task="hopper-medium")
    assert config.attention_settings_by_task == {"primal": {"rank": {"hopper-medium": 24}}}
    check_settings_by_task(config.attention_settings_by_task)  # a known kind and setting
    # A misspelt kind or setting would apply to nothing: refused, naming the closest.
    with pytest.raises(
        ConfigError,
        match=r"attention_settings_by_task.primall: unknown attention 'primall' \(did you mean 'primal'\?\)",
    ):
        check_settings_by_task({"primall": {"rank": {"hopper-medium": 24}}})
    with pytest.raises(
        ConfigError,
        match=r"unknown setting attention_settings_by_task.primal.rnak \(did you mean 'rank'\?\)",
    ):
        check_settings_by_task({"primal": {"rnak": {"hopper-medium": 24}}})


@pytest.mark.parametrize(
    "overrides",
    [
        {"embed_dim": 30, "n_head": 4},
        {"primal_blocks": [3]},
        {"primal_blocks": [0, 3]},
        {"primal_blocks": [-1]},
        {"primal_blocks": "first"},
        {"primal_blocks": "Last"},
    ],
    ids=["indivisible", "index-3", "index-0-3", "index-neg", "unknown", "case"],
)
def test_validate_rejects_bad_model_config(overrides) -> None:
    base = ["model.embed_dim=32", "model.n_layer=3", "model.n_head=2"]
    load_config(None, base)  # the base is fine
    bad = [f"model.{name}={json.dumps(value)}" for name, value in overrides.items()]
    with pytest.raises(ConfigError):
        load_config(None, [*base, *bad])


@pytest.mark.parametrize("primal_blocks", MODELS, ids=MODEL_IDS)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_act_is_the_last_prediction_of_forward(primal_blocks, padded: bool) -> None:
    """act() skips the outputs nobody reads; in float64 it must give the last action of the
    full computation (every token)."""
    model = make_model(primal_blocks).double()
    batch = make_batch(mask=left_padding_mask() if padded else None)
    batch = {k: v.double() if v.is_floating_point() else v for k, v in batch.items()}
    with torch.no_grad():
        expected = model(**batch, every_token=True)[0][:, -1]
        acted = model.act(**batch)
    assert acted.shape == (BATCH, ACT_DIM)
    torch.testing.assert_close(acted, expected, rtol=1e-12, atol=1e-12)


# ------------------------------------------------------- only what the loss reads is computed


@pytest.mark.parametrize("primal_blocks", MODELS + [[1]], ids=MODEL_IDS + ["middle"])
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [(torch.float64, {"rtol": 1e-9, "atol": 1e-12}), (torch.float32, {"rtol": 1e-4, "atol": 1e-6})],
    ids=["float64", "float32"],  # float32: SDPA's fused kernels on CUDA (gpu_check.sh)
)
def test_cut_forward_equals_every_token_forward(primal_blocks, padded, dtype, tolerance) -> None:
    """The training forward (last block at the state tokens, a_K dropped once no Primal block
    reads it) gives the full computation's predictions, KSVD loss and gradients (eval mode)."""
    model = make_model(primal_blocks).to(dtype)
    batch = make_batch(mask=left_padding_mask() if padded else None)
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
    weights = torch.randn(BATCH, K, ACT_DIM, dtype=dtype)  # every prediction counts
    results = []
    for every_token in (True, False):
        model.zero_grad()
        predicted, ksvd = model(**batch, every_token=every_token)
        ((predicted * weights).sum() + 10 * ksvd).backward()
        grads = {name: param.grad for name, param in model.named_parameters()}
        results.append((predicted.detach(), ksvd.detach(), grads))
    (full, full_ksvd, full_grads), (cut, cut_ksvd, cut_grads) = results
    assert cut.shape == (BATCH, K, ACT_DIM)
    torch.testing.assert_close(cut, full, **tolerance)
    torch.testing.assert_close(cut_ksvd, full_ksvd, **tolerance)
    for name, grad in full_grads.items():
        assert grad is not None and cut_grads[name] is not None, name
        torch.testing.assert_close(cut_grads[name], grad, **tolerance, msg=name)


@pytest.mark.parametrize(
    ("primal_blocks", "tokens"),
    [
        ("none", [3 * K - 1, 3 * K - 1, K]),
        ("last", [3 * K, 3 * K, K]),
        ([0], [3 * K, 3 * K - 1, K]),
        ([1], [3 * K, 3 * K, K]),
        ("all", [3 * K, 3 * K, K]),
    ],
    ids=["none", "last", "first", "middle", "all"],
)
def test_blocks_compute_only_the_tokens_the_loss_reads(primal_blocks, tokens: list[int]) -> None:
    """How many tokens each block's MLP sees in training: K state tokens in the last block; 3K - 1
    after the last Primal block (a_K reaches no state token); 3K up to it (its KSVD reads a_K)."""
    model = make_model(primal_blocks).train()
    seen: list[int] = []
    handles = [
        block.mlp.register_forward_hook(lambda module, inputs, output: seen.append(output.shape[1]))
        for block in model.blocks
    ]
    try:
        model(**make_batch())
        assert seen == tokens
        seen.clear()
        model(**make_batch(), every_token=True)
        assert seen == [3 * K] * 3
    finally:
        for handle in handles:
            handle.remove()
