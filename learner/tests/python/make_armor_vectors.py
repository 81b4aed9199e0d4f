"""Writes the ARMOR parity vectors: seeded inputs run through ARMOR's own actor-update code.

Usage: make_armor_vectors.py DP_ACTOR.py CORE_ALGOS.py OUT.json

DP_ACTOR.py is `verl/verl/workers/actor/dp_actor.py` and CORE_ALGOS.py is
`verl/verl/trainer/ppo/core_algos.py` of Hesse73/ARMOR @ 3e393f7. The mixed-probability part of
ARMOR's update is inline in `DataParallelPPOActor.update_policy`, so this script cuts that block
out of DP_ACTOR.py as it is (from the `replace_old_probs` branch to the `policy_loss_fn` call),
and executes it on each case with ARMOR's own `get_policy_loss_fn` (its vanilla dual-clip PPO
loss) from CORE_ALGOS.py; nothing of the reference is re-typed here.

The block is executed in its two parts, cut at `entropy_coeff = self.config.entropy_coeff`: the
pi_old replacement (which reads `mix_probs_main_ratio` for `replace_method = mix`) and the ratio
mixing (which reads `mix_probs_main_ratio` again, and only if `mix_probs`). Both parts see the
same config, except that a case with keel's `replace_ratio` gives the first part that value as
`mix_probs_main_ratio`. With ratio mixing off (keel's mix_ratio = 1: `mix_probs = False`) that
is exactly one reference config (`mix_probs=False, mix_probs_main_ratio=replace_ratio,
replace_method=mix`); with both on at different ratios (not one reference config, since the
reference has one ratio for both) it is the reference's two parts run in sequence, each with its
own ratio. CI does not run this script: learner/tests/armor_parity.rs reads the committed
OUT.json (learner/tests/parity/armor_actor.json).

Needs torch, omegaconf and the `verl` package (0.9.1) importable for CORE_ALGOS.py's imports; the
venv of make_verl_vectors.py has them (with `pyvers` added, which tensordict 0.15 imports).
Everything runs in float64 on the CPU.

Edge cases on purpose: a fully-masked policy row, an observation gap inside a response, finite
garbage at masked positions, log-ratios past the +-20 clamp, dual-clip (c = 10) on negative
advantages, and every option of the public code: the mixture partner (reference, constant 1,
pi_old), `mix_probs_on_ref_only`, and `replace_old_probs` with each method, `replace_on_ref_only`,
`renorm_adv` none/token/seq and `replace_on_adv`, and the replacement's `mix_probs_main_ratio`
apart from the ratio mixing's (keel's `replace_ratio`: mixing off, or at another ratio).

Regenerate (the reference code stays out of keel's tree):
    git -C ARMOR show 3e393f7:verl/verl/workers/actor/dp_actor.py > /tmp/armor_dp_actor.py
    git -C ARMOR show 3e393f7:verl/verl/trainer/ppo/core_algos.py > /tmp/armor_core_algos.py
    /tmp/verl-venv/bin/python learner/tests/python/make_armor_vectors.py /tmp/armor_dp_actor.py \
        /tmp/armor_core_algos.py learner/tests/parity/armor_actor.json
"""
import importlib.util
import itertools
import json
import sys
import textwrap
from types import SimpleNamespace

import numpy as np
import torch
from omegaconf import OmegaConf

torch.manual_seed(20261202)
torch.set_default_dtype(torch.float64)
B, T = 6, 7
START = 'if self.config.replace_old_probs and "source" in micro_batch.non_tensor_batch:'
END = "config=self.config,"
SPLIT = "entropy_coeff = self.config.entropy_coeff"


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def update_block(path):
    """The mixed-probability lines of ARMOR's update_policy, dedented, as two code objects: the
    pi_old replacement and the rest (ratio mixing and the loss), cut at SPLIT."""
    lines = open(path).read().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == START)
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == END) + 1
    assert lines[end].strip() == ")", lines[end]
    split = next(i for i in range(start, end) if lines[i].strip() == SPLIT)
    parts = (lines[start:split], lines[split : end + 1])
    return tuple(compile(textwrap.dedent("\n".join(p)), path, "exec") for p in parts)


def inputs():
    """One seeded batch: rows 3 and 5 are anchors (source 1), row 2 is fully masked."""
    mask = torch.ones(B, T)
    mask[0, 5:] = 0  # right padding
    mask[1, 2:4] = 0  # an observation inside the response
    mask[2, :] = 0  # fully masked
    mask[3, 6:] = 0
    mask[4, 1] = 0
    logp = -torch.rand(B, T) * 3.0 - 0.05
    old = logp + torch.randn(B, T) * 0.4
    ref = logp + torch.randn(B, T) * 1.5
    old[4, 3] = logp[4, 3] - 25.0  # log-ratio past the +20 clamp
    old[4, 4] = logp[4, 4] + 2.5  # a ratio far below 1 - eps
    old[0, 2] = logp[0, 2] - 3.0  # ratio e^3 > c = 10 under a negative advantage
    ref[3, 0] = -30.0  # a near-zero reference probability
    # Finite garbage at masked positions must not matter.
    for t in (logp, old, ref):
        t[mask == 0] = 7.5
    adv = torch.tensor([-1.2, 0.7, 0.3, 1.1, -0.4, -2.0]).unsqueeze(1).expand(B, T).clone()
    adv[1, 5] = 0.0
    source = np.array([0, 0, 0, 1, 0, 1])
    return mask, logp, old, ref, adv, source


def armor_config(opt, main_ratio):
    return OmegaConf.create(
        {
            "clip_ratio": 0.2,
            "clip_ratio_low": 0.2,
            "clip_ratio_high": 0.28,
            "clip_ratio_c": 10.0,
            "policy_loss": {"loss_mode": "vanilla"},
            "entropy_coeff": 0.0,
            "loss_agg_mode": "token-mean",
            "use_dynamic_bsz": False,
            "mix_probs": opt["mix_ratio"] < 1.0,
            "mix_probs_main_ratio": main_ratio,
            "mix_probs_on_ref_only": opt["mix_on_anchors_only"],
            "mix_probs_w_const": opt["mix_partner"] == "one",
            "mix_probs_w_old": opt["mix_partner"] == "old",
            "replace_old_probs": opt["replace_old"] != "none",
            "replace_method": {"none": "mix", "reference": "ref"}.get(opt["replace_old"], opt["replace_old"]),
            "replace_on_ref_only": opt["replace_on_anchors_only"],
            "renorm_adv": opt["renorm_adv"],
            "replace_on_adv": opt["replace_on_advantage"],
        }
    )


def run_case(block, core, opt, batch):
    mask, logp0, old, ref, adv, source = (x.copy() if isinstance(x, np.ndarray) else x.clone() for x in batch)
    logp = logp0.clone().requires_grad_(True)
    # keel's replace_ratio is the replacement's own mix_probs_main_ratio (module doc).
    cfg_replace = armor_config(opt, opt.get("replace_ratio", opt["mix_ratio"]))
    cfg_mix = armor_config(opt, opt["mix_ratio"])

    def forward(model_inputs, temperature, calculate_entropy):
        return None, logp

    scope = {
        "torch": torch,
        "self": SimpleNamespace(config=cfg_replace, gradient_accumulation=1, _forward_micro_batch=forward),
        "micro_batch": SimpleNamespace(non_tensor_batch={"source": source}),
        "model_inputs": {"ref_log_prob": ref},
        "response_mask": mask,
        "old_log_prob": old,
        "advantages": adv,
        "micro_batch_metrics": {},
        "temperature": 1.0,
        "get_policy_loss_fn": core.get_policy_loss_fn,
    }
    replace_part, mix_part = block
    exec(replace_part, scope)
    scope["self"].config = cfg_mix
    exec(mix_part, scope)
    loss = scope["pg_loss"]
    (grad,) = torch.autograd.grad(loss, logp)
    metrics = scope["micro_batch_metrics"]
    return {
        "name": "-".join(f"{k}={v}" for k, v in opt.items()),
        "options": opt,
        "loss": loss.item(),
        "grad": grad.tolist(),
        "pg_clipfrac": scope["pg_clipfrac"].item(),
        "pg_clipfrac_lower": scope["pg_clipfrac_lower"].item(),
        "ppo_kl": scope["ppo_kl"].item(),
        "renorm_weight_mean": metrics.get("actor/renorm_weight_mean"),
    }


def options():
    base = {
        "mix_ratio": 0.9375,
        "mix_on_anchors_only": False,
        "mix_partner": "reference",
        "replace_old": "none",
        "replace_on_anchors_only": True,
        "renorm_adv": "none",
        "replace_on_advantage": False,
    }
    yield dict(base)  # the shipped 7B / QAE scripts
    yield dict(base, mix_ratio=0.875)  # the 8B scripts
    yield dict(base, mix_ratio=1.0)  # no mixing: plain dual-clip PPO
    yield dict(base, mix_on_anchors_only=True)
    yield dict(base, mix_partner="one")
    yield dict(base, mix_partner="old")
    yield dict(base, mix_partner="old", mix_on_anchors_only=True)
    for method, on_anchors, renorm, on_adv, r in itertools.product(
        ["reference", "mix", "avg", "max"], [True, False], ["none", "token", "seq"], [False, True], [0.9375, 1.0]
    ):
        yield dict(
            base,
            mix_ratio=r,
            replace_old=method,
            replace_on_anchors_only=on_anchors,
            renorm_adv=renorm,
            replace_on_advantage=on_adv,
        )
    # The replacement's own ratio: ratio mixing off (the reference's mix_probs = False with
    # mix_probs_main_ratio = 15/16 and replace_method = mix), and both on at different ratios.
    for (r, rr), on_anchors, renorm, on_adv in itertools.product(
        [(1.0, 0.9375), (0.9375, 0.75), (0.875, 0.9375)], [True, False], ["none", "token", "seq"], [False, True]
    ):
        yield dict(
            base,
            mix_ratio=r,
            replace_old="mix",
            replace_ratio=rr,
            replace_on_anchors_only=on_anchors,
            renorm_adv=renorm,
            replace_on_advantage=on_adv,
        )
    yield dict(base, mix_ratio=0.875, mix_partner="old", replace_old="mix", replace_ratio=0.75)
    yield dict(base, mix_ratio=0.875, mix_on_anchors_only=True, replace_old="mix", replace_ratio=0.5)
    yield dict(base, mix_ratio=0.9375, replace_old="mix", replace_ratio=1.0)  # a no-op replacement


def main():
    block = update_block(sys.argv[1])
    core = load("armor_core_algos", sys.argv[2])
    batch = inputs()  # drawn once: every case runs on the same batch
    mask, logp, old, ref, adv, source = batch
    out = {
        "source": "Hesse73/ARMOR @ 3e393f7 verl/verl/workers/actor/dp_actor.py (update_policy) + "
        "verl/verl/trainer/ppo/core_algos.py (compute_policy_loss_vanilla)",
        "torch": torch.__version__,
        "inputs": {
            "mask": mask.tolist(),
            "log_prob": logp.tolist(),
            "old_log_prob": old.tolist(),
            "ref_log_prob": ref.tolist(),
            "advantages": adv.tolist(),
            "anchor": [int(s) for s in source],
        },
        "cases": [run_case(block, core, opt, batch) for opt in options()],
    }
    with open(sys.argv[3], "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
