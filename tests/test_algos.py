"""StarPO math against hand-computed values on small tensors (docs/algorithms.md)."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from ragen.algos.advantages import bi_level_gae, gae, group_index, grpo, normalize_scores
from ragen.algos.filtering import filter_groups
from ragen.algos.losses import (
    agg_loss,
    entropy_from_logits,
    kl_in_reward,
    kl_penalty,
    logprobs_from_logits,
    policy_terms,
    value_terms,
)
from ragen.algos.masked import explained_variance, masked_mean, masked_var, masked_whiten

pytestmark = pytest.mark.unit

T = torch.tensor


def test_masked_reductions():
    x, m = T([[1.0, 2.0, 3.0, 100.0]]), T([[1, 1, 1, 0]])
    assert masked_mean(x, m) == pytest.approx(2.0)
    assert masked_var(x, m) == pytest.approx(1.0)  # unbiased: ((1)^2 + 0 + 1^2) / 2
    w = masked_whiten(x, m)
    assert w.tolist()[0] == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-6)



def test_explained_variance_hand_computed_and_undefined_for_constant_returns():
    r, m = T([[1.0, 2.0, 3.0, 50.0]]), T([[1, 1, 1, 0]])
    # residuals 0, 1, 0 -> unbiased var 1/3; Var(returns) = 1 -> EV 2/3 (the masked-out 50 is ignored)
    assert explained_variance(r, T([[1.0, 1.0, 3.0, 0.0]]), m) == pytest.approx(2 / 3)
    assert explained_variance(r, r, m) == pytest.approx(1.0)
    # every trajectory scored 10.79: float noise in the returns must not read as a huge negative EV
    const = T([[10.79, 10.79 + 1e-6, 10.79, 0.0]])
    assert math.isnan(explained_variance(const, T([[0.5, 0.4, 0.3, 0.0]]), m))
    assert math.isnan(explained_variance(r, r, T([[1, 0, 0, 0]])))  # one entry: no variance to explain

def test_gae_gamma_lambda_one_is_reward_to_go_minus_value():
    r = T([[0.0, 0.0, 1.0, 0.0, 2.0]])
    v = T([[0.5, 0.1, -0.3, 0.2, 0.4]])
    m = torch.ones_like(r)
    adv, ret = gae(r, v, m, whiten=False)
    togo = T([[3.0, 3.0, 3.0, 2.0, 2.0]])
    assert adv.tolist()[0] == pytest.approx((togo - v).tolist()[0])
    assert ret.tolist()[0] == pytest.approx(togo.tolist()[0])


def test_gae_hand_computed_discounted():
    r, v = T([[0.0, 1.0]]), T([[0.5, 0.2]])
    adv, ret = gae(r, v, torch.ones_like(r), gamma=0.9, lam=0.5, whiten=False)
    d1 = 1.0 - 0.2  # last position: V beyond the end is 0
    d0 = 0.0 + 0.9 * 0.2 - 0.5
    assert adv.tolist()[0] == pytest.approx([d0 + 0.9 * 0.5 * d1, d1])
    assert ret.tolist()[0] == pytest.approx([d0 + 0.45 * d1 + 0.5, d1 + 0.2])


def test_gae_ignores_right_padding_and_whitens_over_mask():
    r = T([[0.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    v = T([[0.0, 0.0, 9.0], [0.0, 0.0, 0.0]])  # 9 is a padding position's garbage value
    valid = T([[1, 1, 0], [1, 1, 1]])
    mask = T([[0, 1, 0], [0, 1, 1]])
    _, ret = gae(r, v, mask, valid, whiten=False)
    assert ret[0].tolist() == pytest.approx([1.0, 1.0, 0.0])
    w, _ = gae(r, v, mask, valid)
    sel = w[mask.bool()]
    assert float(sel.mean()) == pytest.approx(0.0, abs=1e-6) and (w[~mask.bool()] == 0).all()


def test_bi_level_gae_turn_then_token_level():
    # one trajectory, two turns: tokens 0-1 (end at 1), tokens 3-4 (end at 4); token 2 is a user token
    r = T([[0.0, 0.0, 0.0, 0.0, 1.0]])  # zero-reward first turn: the original would not see it as a turn
    v = T([[0.1, 0.2, 0.0, 0.3, 0.4]])
    mask = T([[1, 1, 0, 1, 1]])
    ends = T([[0, 1, 0, 0, 1]]).bool()
    gh, g, lam = 0.95, 1.0, 1.0
    a2 = 1.0 - 0.4  # last turn: r + 0 - V(e2)
    a1 = 0.0 + gh * 0.4 - 0.2 + gh * lam * a2
    r1, r2 = a1 + 0.2, a2 + 0.4  # turn-level returns become the ends' rewards
    adv, ret = bi_level_gae(r, v, mask, ends, gamma=g, lam=lam, high_level_gamma=gh, whiten=False)
    # token level within each turn, reset at each end
    exp = [0.0] * 5
    exp[1] = r1 - 0.2
    exp[0] = 0 + g * 0.2 - 0.1 + g * lam * exp[1]
    exp[4] = r2 - 0.4
    exp[3] = 0 + g * 0.4 - 0.3 + g * lam * exp[4]
    assert adv[0].tolist() == pytest.approx(exp)
    assert ret[0, 4].item() == pytest.approx(r2) and ret[0, 1].item() == pytest.approx(r1)


def test_normalize_scores_modes():
    s, g = T([1.0, 3.0, 2.0, 2.0]), T([0, 0, 1, 1])
    assert normalize_scores(s, g, "identity").tolist() == [1.0, 3.0, 2.0, 2.0]
    assert normalize_scores(s, g, "mean").tolist() == [-1.0, 1.0, 0.0, 0.0]
    std = math.sqrt(2)
    ms = normalize_scores(s, g, "mean_std").tolist()
    assert ms == pytest.approx([-1 / (std + 1e-6), 1 / (std + 1e-6), 0.0, 0.0])  # zero-variance group -> 0
    big = normalize_scores(T([0.0, 10.0, 0.0, 0.0]), T([0, 0, 0, 0]), "asym_clip").tolist()
    assert max(big) <= 3.0 and min(big) >= -1.0
    assert normalize_scores(s, T([0, 1, 2, 3]), "mean_std").tolist() == s.tolist()  # singleton groups: unchanged
    with pytest.raises(ValueError, match="unknown normalisation"):
        normalize_scores(s, g, "zscore")


def test_grpo_group_baseline_and_length_weight():
    s, g = T([1.0, 3.0, 5.0, 5.0]), T([0, 0, 1, 1])
    mask = T([[1, 1, 0], [1, 0, 0], [1, 1, 1], [1, 1, 1]])
    a = grpo(s, g, mask)
    std = math.sqrt(2)
    assert a[0].tolist() == pytest.approx([-1 / (std + 1e-6)] * 2 + [0.0])
    assert a[1].tolist() == pytest.approx([1 / (std + 1e-6), 0.0, 0.0])
    assert (a[2:] == 0).all()  # zero-variance group gets no advantage
    w = grpo(s, g, mask, length_weight=True)
    n_mean = (2 + 1 + 3 + 3) / 4
    assert w[0, 0].item() == pytest.approx(a[0, 0].item() / (2 / n_mean), rel=1e-5)
    assert group_index(["b", "a", "b"]).tolist() == [0, 1, 0]


def test_policy_clip_decoupled_and_dual():
    old = torch.zeros(4)
    ratio = T([1.5, 0.5, 10.0, 1.1])
    logp = ratio.log()
    adv = T([1.0, 1.0, -1.0, -1.0])
    p = policy_terms(logp, old, adv, clip_low=0.2, clip_high=0.28, clip_c=3.0)
    # A>0, r=1.5: max(-1.5, -1.28) = -1.28 (clipped high); A>0, r=0.5: max(-0.5, -0.8) = -0.5 (unclipped)
    # A<0, r=10: max(10, 1.28) = 10, dual clip -> min(10, 3) = 3; A<0, r=1.1: max(1.1, 1.1) = 1.1
    assert p.loss_mat.tolist() == pytest.approx([-1.28, -0.5, 3.0, 1.1], rel=1e-5)
    assert p.clipped.tolist() == [True, False, False, False]
    assert p.dual_clipped.tolist() == [False, False, True, False]
    assert p.neg_approx_kl.tolist() == pytest.approx((-logp).tolist())


@settings(max_examples=200, deadline=None)
@given(st.floats(-3, 3), st.floats(-5, 5))
def test_dual_clip_binds_only_for_negative_advantages(log_ratio, a):
    p = policy_terms(T([log_ratio]), T([0.0]), T([a]), clip_c=3.0)
    if a >= 0:
        assert not p.dual_clipped.item()
        assert p.loss_mat.item() >= -a * math.exp(log_ratio) * (1 + 1e-6) - 1e-6  # never below unclipped
    else:
        assert p.loss_mat.item() <= -a * 3.0 * (1 + 1e-6) + 1e-6  # fp32 rounding of -A * c


def test_agg_modes_hand_computed():
    loss = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    m = T([[1, 1, 0], [1, 0, 0]])
    assert agg_loss(loss, m, "token-mean").item() == pytest.approx((1 + 2 + 4) / 3)
    assert agg_loss(loss, m, "seq-mean-token-sum").item() == pytest.approx((3 + 4) / 2)
    assert agg_loss(loss, m, "seq-mean-token-mean").item() == pytest.approx((1.5 + 4) / 2)
    assert agg_loss(loss, m, "seq-mean-token-sum-norm").item() == pytest.approx((3 + 4) / 3 / 2)
    # micro-batch invariance: the two halves with the mini-batch's denominators sum to the whole
    for mode, denom in (("token-mean", 3), ("seq-mean-token-mean", 2)):
        halves = agg_loss(loss[:1], m[:1], mode, denom) + agg_loss(loss[1:], m[1:], mode, denom)
        assert halves.item() == pytest.approx(agg_loss(loss, m, mode).item())
    with pytest.raises(ValueError, match="loss_agg_mode"):
        agg_loss(loss, m, "mean")


def test_value_loss_clip():
    v, old, g = T([2.0, 0.1]), T([0.0, 0.0]), T([0.0, 1.0])
    loss, clipped = value_terms(v, old, g, clip=0.5)
    # v=2: unclipped (2-0)^2=4, clipped (0.5-0)^2=0.25 -> 0.5*4; v=0.1: (0.1-1)^2=.81 vs (0.1-1)^2 -> .405
    assert loss.tolist() == pytest.approx([2.0, 0.405])
    assert clipped.tolist() == [False, False]
    l2, c2 = value_terms(T([0.0]), T([2.0]), T([0.0]), clip=0.5)  # V moved towards G, clip holds it at 1.5
    assert l2.item() == pytest.approx(0.5 * 1.5**2) and c2.item()


def test_entropy_and_logprobs():
    logits = torch.zeros(1, 4)
    assert entropy_from_logits(logits).item() == pytest.approx(math.log(4))
    assert entropy_from_logits(T([[100.0, 0.0, 0.0]])).item() == pytest.approx(0.0, abs=1e-6)
    lp = logprobs_from_logits(T([[1.0, 2.0, 3.0]]), T([2]))
    assert lp.item() == pytest.approx(3 - math.log(math.e + math.e**2 + math.e**3))


@settings(max_examples=200, deadline=None)
@given(st.floats(-20, 0), st.floats(-20, 0))
def test_kl_estimators(x, y):
    lp, ref = T([x]), T([y])
    assert kl_penalty(lp, ref, "kl").item() == pytest.approx(x - y, abs=1e-5)
    assert kl_penalty(lp, ref, "abs").item() == pytest.approx(abs(x - y), abs=1e-5)
    assert kl_penalty(lp, ref, "mse").item() == pytest.approx(0.5 * (x - y) ** 2, rel=1e-4, abs=1e-5)
    k3 = kl_penalty(lp, ref, "low_var_kl").item()
    assert 0.0 <= k3 <= 10.0  # non-negative and clamped


def test_kl_in_reward():
    r = T([[0.0, 1.0]])
    new, kl = kl_in_reward(r, T([[-1.0, -1.0]]), T([[-2.0, -1.5]]), T([[1, 1]]), beta=0.1)
    assert new.tolist()[0] == pytest.approx([-0.1, 1.0 - 0.05]) and kl.item() == pytest.approx(0.75)


def test_filter_keeps_int_ratio_groups_by_std():
    # 4 groups of 2: stds 0, sqrt(2)/2*2.., pick by spread
    scores = T([0.0, 0.0, 0.0, 2.0, 1.0, 1.0, 0.0, 4.0])
    groups = T([0, 0, 1, 1, 2, 2, 3, 3])
    res = filter_groups(scores, groups, 0.5, "std")
    assert res.kept_groups == [1, 3] and res.keep.tolist() == [False, False, True, True, False, False, True, True]
    assert filter_groups(scores, groups, 0.25, "std").kept_groups == [3]
    assert filter_groups(scores, groups, 0.5, "std_rev").kept_groups == [0, 2]  # ties keep the earlier groups
    assert filter_groups(scores, groups, 1.0, "std").kept_groups == [0, 1, 2, 3]
    m = res.metrics
    stds = [0.0, math.sqrt(2), 0.0, 2 * math.sqrt(2)]
    assert m["rollout/in_group_std"] == pytest.approx(sum(stds) / 4)
    assert m["rollout/chosen_in_group_std"] == pytest.approx((stds[1] + stds[3]) / 2)
    assert m["rollout/chosen_in_group_max"] == pytest.approx(3.0)


def test_filter_top_p_and_max_mean():
    scores = T([0.0, 0.0, 0.0, 2.0, 1.0, 1.0, 0.0, 4.0])  # variances 0, 2, 0, 8
    groups = T([0, 0, 1, 1, 2, 2, 3, 3])
    assert filter_groups(scores, groups, 0.8, "top_p").kept_groups == [3]  # 8 / 10 >= 0.8
    assert filter_groups(scores, groups, 0.9, "top_p").kept_groups == [1, 3]
    assert filter_groups(scores, groups, 0.25, "max_mean").kept_groups == [3]
    with pytest.raises(ValueError, match="filter_type"):
        filter_groups(scores, groups, 0.5, "random")


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.integers(1, 5), st.floats(0.01, 1.0))
def test_filter_count_property(n_groups, size, ratio):
    scores = torch.randn(n_groups * size, generator=torch.Generator().manual_seed(n_groups * 31 + size))
    groups = torch.arange(n_groups).repeat_interleave(size)
    res = filter_groups(scores, groups, ratio, "std")
    expect = n_groups if ratio >= 1 else max(1, int(ratio * n_groups))
    assert len(res.kept_groups) == expect and int(res.keep.sum()) == expect * size


def test_the_estimator_table_is_the_schema_and_the_dispatch():
    """ESTIMATORS, the config's Literal and compute_advantages agree: one table says which estimators exist and
    which need a critic."""
    import typing

    from ragen.algos.advantages import ESTIMATORS, compute_advantages, needs_critic
    from ragen.config import AlgorithmConfig

    assert set(typing.get_args(AlgorithmConfig.model_fields["adv_estimator"].annotation)) == set(ESTIMATORS)
    assert needs_critic("gae") and not needs_critic("grpo")
    with pytest.raises(ValueError, match="one of"):
        needs_critic("vtrace")
    # GRPO through the dispatch equals grpo(); GAE without values is refused
    scores, groups, mask = T([1.0, 0.0]), T([0, 0]), T([[1, 1], [1, 1]])
    adv, ret = compute_advantages("grpo", rewards=torch.zeros(2, 2), values=None, scores=scores, groups=groups,
                                  mask=mask, grpo_norm="mean")
    assert ret is None and adv.tolist() == [[0.5, 0.5], [-0.5, -0.5]]
    with pytest.raises(ValueError, match="needs the critic"):
        compute_advantages("gae", rewards=torch.zeros(2, 2), values=None, scores=scores, groups=groups, mask=mask)
