"""Writes the verl parity vectors: seeded inputs run through verl's own `core_algos` functions.

Usage: make_verl_vectors.py OUT.json

Needs the `verl` package (tested with 0.9.1 from PyPI) importable next to torch; CI does not run
this script: it reads the committed OUT.json (learner/tests/parity/verl_core_algos.json), so the
parity test (learner/tests/verl_parity.rs) needs no Python. Everything runs in float64 on the
CPU; every case records verl's outputs and, for the losses, verl's autograd gradient.

One way to get verl importable without its GPU stack (its top-level package imports ray and
tensordict even though core_algos needs neither at run time):
    python3 -m venv --system-site-packages /tmp/verl-venv
    /tmp/verl-venv/bin/pip install --no-deps verl==0.9.1 omegaconf antlr4-python3-runtime \
        codetiming ray tensordict
    /tmp/verl-venv/bin/python learner/tests/python/make_verl_vectors.py \
        learner/tests/parity/verl_core_algos.json

Edge cases on purpose: fully-masked rows, observation gaps inside a response, finite garbage at
masked positions, the log-ratio clamp at +-20, k3's clamps, GSPO's clamp at 10, dual-clip,
clip-higher, singleton and zero-variance GRPO groups, near-one-hot and uniform logits, and
global denominators over micro-batch splits.
"""
import json
import sys
from importlib import metadata

import numpy as np
import torch

import verl.trainer.ppo.core_algos as ca
import verl.utils.torch_functional as vf
from verl.workers.config import ActorConfig

torch.manual_seed(20261201)
torch.set_default_dtype(torch.float64)
B, T = 5, 9


def lst(x):
    return x.detach().tolist()


def mask_with_edges():
    """Row 0 full, row 1 with an observation gap, row 2 fully masked, rows 3-4 left-aligned."""
    m = torch.zeros(B, T)
    m[0, :] = 1
    m[1, [0, 1, 2, 5, 6, 8]] = 1
    m[3, :4] = 1
    m[4, :7] = 1
    return m


def garbage(x, m, value=37.5):
    """x with finite garbage at mask-0 positions."""
    return torch.where(m.bool(), x, torch.full_like(x, value))


def actor_config(low, high, c, info):
    return ActorConfig(
        strategy="fsdp",
        rollout_n=1,
        ppo_mini_batch_size=B,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio=low,
        clip_ratio_low=low,
        clip_ratio_high=high,
        clip_ratio_c=c,
        global_batch_info=info,
    )


class BypassConfig:
    """The two fields verl's bypass-mode loss reads from its actor config."""

    def __init__(self, rollout_correction):
        self.policy_loss = {"rollout_correction": rollout_correction}
        self.global_batch_info = {}


MODES = ["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def agg_cases():
    out = []
    m = mask_with_edges()
    loss = garbage(torch.randn(B, T) * 2.0, m, 1e3)
    for mode in MODES:
        for scale in [None, 16.0]:
            if scale is not None and mode != "seq-mean-token-sum-norm":
                continue
            kw = {} if scale is None else {"loss_scale_factor": scale}
            whole = ca.agg_loss(loss, m, mode, **kw)
            # The same mini-batch as two micro-batches under the global denominators.
            n_tok = m.sum()
            n_seq = (m.sum(-1) > 0).float().sum()
            parts = 0.0
            for rows in ([0, 1], [2, 3, 4]):
                parts = parts + ca.agg_loss(
                    loss[rows], m[rows], mode, batch_num_tokens=n_tok, global_batch_size=n_seq,
                    loss_scale_factor=scale if scale is not None else T,
                )
            out.append({
                "name": f"{mode}{'' if scale is None else '-H16'}",
                "mode": mode, "scale": scale, "loss": lst(loss), "mask": lst(m),
                "expected": whole.item(), "expected_split": float(parts),
            })
    return out


def policy_inputs(case):
    m = mask_with_edges()
    old = -torch.rand(B, T) * 3.0
    lp = old + torch.randn(B, T) * 0.3
    adv = torch.randn(B, T)
    if case == "clamps":
        lp[0, 1] = old[0, 1] + 25.0   # beyond the +20 clamp
        lp[0, 2] = old[0, 2] - 25.0   # beyond the -20 clamp
        adv[0, 2] = -1.5
    if case == "dual":
        lp[4, :3] = old[4, :3] + 1.6  # ratio ~5 > c = 3
        adv[4, :3] = -torch.rand(3) - 0.5
    return garbage(old, m, -4.0), garbage(lp, m, 60.0), garbage(adv, m, 9.0), m


def policy_cases():
    out = []
    for case, low, high, c, mode in [
        ("plain", 0.2, 0.2, 3.0, "token-mean"),
        ("clip-higher", 0.2, 0.28, 3.0, "token-mean"),
        ("clamps", 0.2, 0.2, 3.0, "token-mean"),
        ("dual", 0.2, 0.2, 3.0, "seq-mean-token-mean"),
        ("dual-off", 0.2, 0.2, 1e12, "seq-mean-token-sum"),
        ("drgrpo", 0.2, 0.2, 3.0, "seq-mean-token-sum-norm"),
    ]:
        old, lp, adv, m = policy_inputs("dual" if case.startswith("dual") else case)
        lp = lp.clone().requires_grad_(True)
        cfg = actor_config(low, high, c, {})
        loss, metrics = ca.compute_policy_loss_vanilla(old, lp, adv, m, mode, cfg)
        (grad,) = torch.autograd.grad(loss, lp)
        out.append({
            "name": f"vanilla-{case}", "kind": "vanilla", "old_log_prob": lst(old), "log_prob": lst(lp),
            "advantages": lst(adv), "mask": lst(m), "clip_low": low, "clip_high": high,
            "clip_c": None if c > 1e6 else c, "agg_mode": mode, "loss": loss.item(), "grad": lst(grad),
            "pg_clipfrac": metrics["actor/pg_clipfrac"], "ppo_kl": metrics["actor/ppo_kl"],
            "pg_clipfrac_lower": metrics["actor/pg_clipfrac_lower"],
        })
    for case, mode in [("reinforce", "token-mean"), ("reinforce-seq", "seq-mean-token-sum")]:
        # verl's bypass mode with loss_type "reinforce": token-level IS weights against the
        # rollout (behaviour) log-probs, truncated at rollout_is_threshold = 2.0.
        beh, lp, adv, m = policy_inputs("clamps")
        lp = lp.clone().requires_grad_(True)
        cfg = BypassConfig({"loss_type": "reinforce", "rollout_is": "token", "rollout_is_threshold": 2.0})
        loss, metrics = ca.compute_policy_loss_bypass_mode(beh, lp, adv, m, mode, cfg)
        (grad,) = torch.autograd.grad(loss, lp)
        out.append({
            "name": case, "kind": "reinforce", "old_log_prob": lst(beh), "log_prob": lst(lp),
            "advantages": lst(adv), "mask": lst(m), "clip_low": 0.2, "clip_high": 0.2,
            "clip_c": None, "is_threshold": 2.0, "agg_mode": mode, "loss": loss.item(), "grad": lst(grad),
            "ppo_kl": metrics["actor/ppo_kl"],
        })
    for case, shift in [("gspo", 0.0), ("gspo-clamp", 12.0)]:
        old, lp, adv, m = policy_inputs("plain")
        # The sequence advantage is one value per row (GRPO-style).
        adv = garbage(adv[:, :1].expand(B, T).clone(), m, 9.0)
        lp = lp.clone()
        lp[0] = lp[0] + shift  # row 0's mean log-ratio beyond GSPO's clamp at 10
        lp = lp.requires_grad_(True)
        cfg = actor_config(3e-4, 4e-4, 3.0, {})
        loss, metrics = ca.compute_policy_loss_gspo(old, lp, adv, m, "seq-mean-token-mean", cfg)
        (grad,) = torch.autograd.grad(loss, lp)
        out.append({
            "name": case, "kind": "gspo", "old_log_prob": lst(old), "log_prob": lst(lp),
            "advantages": lst(adv), "mask": lst(m), "clip_low": 3e-4, "clip_high": 4e-4,
            "clip_c": None, "agg_mode": "seq-mean-token-mean", "loss": loss.item(), "grad": lst(grad),
            "pg_clipfrac": metrics["actor/pg_clipfrac"], "ppo_kl": metrics["actor/ppo_kl"],
            "pg_clipfrac_lower": metrics["actor/pg_clipfrac_lower"],
        })
    return out


def kl_cases():
    out = []
    m = mask_with_edges()
    lp = -torch.rand(B, T) * 4.0
    ref = lp + torch.randn(B, T) * 0.7
    ref[0, 0] = lp[0, 0] + 24.0   # k3: x beyond the +20 clamp
    ref[0, 3] = lp[0, 3] + 3.0    # k3: exp(3) - 4 > 10, its value clamp
    ref[1, 1] = lp[1, 1] - 23.0   # k3: x beyond the -20 clamp
    for est in ["kl", "abs", "mse", "low_var_kl", "k1+", "abs+", "k3+"]:
        x = lp.clone().requires_grad_(True)
        kl = ca.kl_penalty(x, ref, est)
        total = ca.agg_loss(kl, m, "token-mean")
        (grad,) = torch.autograd.grad(total, x)
        out.append({
            "name": est, "estimator": est, "logprob": lst(lp), "ref_logprob": lst(ref), "mask": lst(m),
            "value": lst(kl), "token_mean": total.item(), "grad": lst(grad),
        })
    return out


def gae_cases():
    out = []
    m = mask_with_edges()
    m[2, 0] = 1  # whitening needs a valid token per row here; row 2 gets one
    for gamma, lam in [(1.0, 1.0), (0.99, 0.95), (1.0, 0.9)]:
        r = torch.zeros(B, T)
        last = [int(torch.nonzero(m[b]).max()) for b in range(B)]
        for b, t in enumerate(last):
            r[b, t] = float(torch.randn(()))
        r[1, 1] = 0.3  # a per-token reward inside a response
        v = garbage(torch.randn(B, T) * 0.5, m, 5.0)
        adv, ret = ca.compute_gae_advantage_return(r, v, m, gamma, lam)
        out.append({
            "name": f"gamma{gamma}-lam{lam}", "rewards": lst(r), "values": lst(v), "mask": lst(m),
            "gamma": gamma, "lam": lam, "advantages": lst(adv), "returns": lst(ret),
        })
    return out


def grpo_cases():
    out = []
    scores = [1.0, 0.0, 1.0, 1.0, 0.5, 0.5, 0.5, 2.0, -1.0, 0.25, 3.0]
    index = ["a", "a", "a", "a", "b", "b", "b", "c", "d", "d", "e"]  # b: zero variance; c, e: singletons
    r = torch.zeros(len(scores), 3)
    r[:, -1] = torch.tensor(scores)
    m = torch.ones(len(scores), 3)
    for norm in [True, False]:
        adv, _ = ca.compute_grpo_outcome_advantage(r, m, np.array(index, dtype=object), 1e-6, norm)
        groups = {k: i for i, k in enumerate(dict.fromkeys(index))}
        out.append({
            "name": "grpo" if norm else "drgrpo", "scores": scores, "group_ids": [groups[k] for k in index],
            "norm_adv_by_std": norm, "advantages": [row[-1] for row in lst(adv)],
        })
    return out


def value_cases():
    out = []
    m = mask_with_edges()
    old = torch.randn(B, T)
    ret = garbage(old + torch.randn(B, T), m, -8.0)
    for clip, mode in [(0.2, "token-mean"), (0.5, "seq-mean-token-mean"), (1e9, "token-mean")]:
        vp = garbage(old + torch.randn(B, T) * 0.6, m, 11.0).requires_grad_(True)
        loss, clipfrac = ca.compute_value_loss(vp, ret, old, m, clip, mode)
        (grad,) = torch.autograd.grad(loss, vp)
        out.append({
            "name": f"clip{clip}-{mode}", "vpreds": lst(vp), "values": lst(old), "returns": lst(ret),
            "mask": lst(m), "clip": None if clip > 1e6 else clip, "agg_mode": mode, "loss": loss.item(),
            "vf_clipfrac": float(clipfrac), "grad": lst(grad),
        })
    return out


def logit_cases():
    out = []
    V = 11
    logits = torch.randn(3, 6, V) * 2.0
    logits[0, 2] = 0.0                    # uniform
    logits[1, 3] = -30.0
    logits[1, 3, 4] = 30.0                # near one-hot
    tokens = torch.randint(0, V, (3, 6))
    ent = vf.entropy_from_logits(logits)
    lp = vf.logprobs_from_logits(logits[:, :-1], tokens[:, 1:])
    out.append({
        "name": "mixed", "logits": lst(logits), "tokens": tokens.tolist(),
        "entropy": lst(ent), "logprobs_next": lst(lp),
    })
    return out


def main():
    out = {
        "source": f"verl {metadata.version('verl')} (PyPI), verl/trainer/ppo/core_algos.py",
        "torch": torch.__version__,
        "dtype": "float64",
        "agg_loss": agg_cases(),
        "policy_loss": policy_cases(),
        "kl": kl_cases(),
        "gae": gae_cases(),
        "grpo": grpo_cases(),
        "value_loss": value_cases(),
        "logits": logit_cases(),
    }
    with open(sys.argv[1], "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
