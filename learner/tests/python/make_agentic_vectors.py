"""Writes the GiGPO (ARL-Arena) and Dr. MAS parity vectors from the reference repositories' own code.

Usage: make_agentic_vectors.py ARL_CORE_ALGOS.py DRMAS_CORE_ALGOS.py OUT.json

ARL_CORE_ALGOS.py is `recipe/shop_agent/ppo/core_algos.py` of WillDreamer/ARL-Arena @ a25a2a2 (the
SAMPO / GiGPO advantage code), DRMAS_CORE_ALGOS.py is `verl/trainer/ppo/core_algos.py` of
langfengQ/DrMAS @ 19c632b; both are loaded as modules as they are, with the `verl` package (0.9.1)
importable for their imports (see make_verl_vectors.py for a venv that has it). CI does not run this
script: learner/tests/agentic_parity.rs reads the committed OUT.json
(learner/tests/parity/agentic_advantages.json).

Records are layout P (one row per turn / agent invocation). GiGPO's step returns come from the
reference's own `compute_step_discounted_returns` (float32, as in the reference), its groups from
`build_step_group`, with exact anchors and with its similarity option (`enable_similarity`:
`difflib.SequenceMatcher(None, a, b).ratio() >= similarity_thresh` against each cluster's first
observation, within one prompt group); `are_similar`'s ratios are recorded for string pairs that
include ones past difflib's 200-element autojunk threshold.
"""
import importlib.util
import json
import sys
from difflib import SequenceMatcher
from types import SimpleNamespace

import numpy as np
import torch

torch.set_default_dtype(torch.float64)


def load(name, path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def gigpo_records():
    """Two prompt groups; episodes of 1-3 turns; anchors shared within a group, and one anchor
    string shared across groups (it must not join their step groups)."""
    rows = [
        # uid, traj, anchor observation, episode reward R_j, step reward, invalid
        (0, 0, "start kitchen", 1.0, 0.0, False),
        (0, 0, "at fridge", 1.0, 0.0, False),
        (0, 0, "fridge open", 1.0, 1.0, False),
        (0, 1, "start kitchen", 0.0, 0.0, True),
        (0, 1, "at sink", 0.0, 0.0, False),
        (0, 2, "start kitchen", 1.0, 0.0, False),
        (0, 2, "at fridge", 1.0, 1.0, False),
        (1, 3, "start hall", 0.0, 0.0, False),
        (1, 3, "at fridge", 0.0, 0.0, False),
        (1, 4, "start hall", 1.0, 1.0, False),
        (1, 5, "start hall", 0.0, 0.0, True),
        (2, 6, "alone", 0.5, 0.5, False),
    ]
    return rows


def penalised(rows, penalty):
    """Per record: the episode score and the step reward, each minus the invalid-action penalty."""
    scores = [r[3] - (penalty if r[5] else 0.0) for r in rows]
    step_rewards = [r[4] - (penalty if r[5] else 0.0) for r in rows]
    return scores, step_rewards


def step_returns(arl, rows, step_rewards, gamma):
    """The reference's own step returns (float32) over the records' step rewards."""
    n = len(rows)
    batch = SimpleNamespace(
        non_tensor_batch={
            "rewards": np.array(step_rewards, dtype=np.float64),
            "traj_uid": np.array([f"t{r[1]}" for r in rows], dtype=object),
            "active_masks": np.ones(n, dtype=bool),
        },
        batch={"input_ids": torch.zeros(n, 1)},
    )
    return arl.compute_step_discounted_returns(batch, gamma)


def gigpo_cases(arl):
    penalty = 0.1
    rows = gigpo_records()
    n, length = len(rows), 4
    scores, step_rewards = penalised(rows, penalty)
    out = []
    for gamma in [0.95, 1.0]:
        returns = step_returns(arl, rows, step_rewards, gamma)
        for mode in ["mean_norm", "mean_std_norm"]:
            tlr = torch.zeros(n, length)
            tlr[:, -1] = torch.tensor(scores)
            mask = torch.ones(n, length)
            adv, _ = arl.compute_gigpo_outcome_advantage(
                tlr,
                returns,
                mask,
                np.array([r[2] for r in rows], dtype=object),
                np.array([f"u{r[0]}" for r in rows], dtype=object),
                np.array([f"t{r[1]}" for r in rows], dtype=object),
                epsilon=1e-6,
                step_advantage_w=1.0,
                mode=mode,
            )
            anchors = {a: i for i, a in enumerate(dict.fromkeys(r[2] for r in rows))}
            out.append({
                "name": f"{mode}-gamma{gamma}",
                "mode": mode,
                "gamma": gamma,
                "uid": [r[0] for r in rows],
                "traj": [r[1] for r in rows],
                "anchor": [anchors[r[2]] for r in rows],
                "score": scores,
                "step_reward": step_rewards,
                "returns": returns.tolist(),
                "advantages": adv[:, 0].tolist(),
            })
    return out


def similarity_records():
    """Anchor observations that differ by a few characters, one uid sharing text with another
    (never merged across uids), and a long observation past difflib's autojunk length."""
    long_a = "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, " \
        "a countertop 1, a drawer 2, a fridge 1, a garbagecan 1, a microwave 1, a shelf 3, " \
        "a sinkbasin 1, a stoveburner 4, and a toaster 1. Your task is to: put a clean apple in fridge."
    long_b = long_a.replace("drawer 2", "drawer 3").replace("shelf 3", "shelf 1")
    rows = [
        # uid, traj, anchor observation, episode reward R_j, step reward, invalid
        (0, 0, "at fridge 1, holding apple 1", 1.0, 0.0, False),
        (0, 0, "fridge 1 is open", 1.0, 1.0, False),
        (0, 1, "at fridge 1, holding apple 2", 0.0, 0.0, True),
        (0, 1, "fridge 1 is closed", 0.0, 0.0, False),
        (0, 2, "at sink 1, holding apple 1", 1.0, 1.0, False),
        (1, 3, long_a, 0.0, 0.0, False),
        (1, 3, "at fridge 1, holding apple 1", 0.0, 0.0, False),
        (1, 4, long_b, 1.0, 0.0, False),
        (1, 4, "at fridge 1, holding apple 9", 1.0, 1.0, False),
        (1, 5, "nothing happens", 0.0, 0.0, True),
    ]
    return rows


def similarity_cases(arl):
    penalty = 0.1
    rows = similarity_records()
    n, length = len(rows), 3
    scores, step_rewards = penalised(rows, penalty)
    returns = step_returns(arl, rows, step_rewards, 0.95)
    obs = np.array([r[2] for r in rows], dtype=object)
    index = np.array([f"u{r[0]}" for r in rows], dtype=object)
    out = []
    for thresh in [0.5, 0.9, 0.95, 0.99]:
        groups = arl.build_step_group(obs, index, True, thresh)
        first = {}
        labels = [first.setdefault(g, i) for i, g in enumerate(groups)]
        for mode in ["mean_norm", "mean_std_norm"]:
            tlr = torch.zeros(n, length)
            tlr[:, -1] = torch.tensor(scores)
            adv, _ = arl.compute_gigpo_outcome_advantage(
                tlr, returns, torch.ones(n, length), obs, index,
                np.array([f"t{r[1]}" for r in rows], dtype=object),
                epsilon=1e-6, step_advantage_w=1.0, mode=mode,
                enable_similarity=True, similarity_thresh=thresh,
            )
            out.append({
                "name": f"similarity{thresh}-{mode}",
                "mode": mode,
                "gamma": 0.95,
                "similarity_thresh": thresh,
                "uid": [r[0] for r in rows],
                "traj": [r[1] for r in rows],
                "text": [r[2] for r in rows],
                "step_group_first": labels,
                "score": scores,
                "step_reward": step_rewards,
                "returns": returns.tolist(),
                "advantages": adv[:, 0].tolist(),
            })
    texts = sorted({r[2] for r in rows})
    pairs = [
        {"a": a, "b": b, "ratio": SequenceMatcher(None, a, b).ratio(),
         "similar_095": bool(arl.are_similar(a, b, 0.95))}
        for a in texts for b in texts
    ]
    return out, pairs


def drmas_cases(drmas):
    # Two prompt groups, two agents (0 solver, 1 verifier), episodes with several invocations.
    rows = [
        # uid, traj, agent, score
        (0, 0, 0, 1.0), (0, 0, 1, 1.0), (0, 0, 0, 0.9),
        (0, 1, 0, 0.0), (0, 1, 1, -0.1),
        (0, 2, 0, 1.0), (0, 2, 1, 1.0),
        (1, 3, 0, 0.0), (1, 3, 1, 0.0),
        (1, 4, 0, 0.0), (1, 4, 1, 0.0),   # flat group for both agents
        (2, 5, 1, 0.7),                   # a singleton (uid, agent) pool
    ]
    n = len(rows)
    tlr = torch.zeros(n, 3)
    tlr[:, -1] = torch.tensor([r[3] for r in rows])
    mask = torch.ones(n, 3)
    out = []
    for by_agent in [True, False]:
        for norm in [True, False]:
            index = np.array(
                [f"u{r[0]}_{r[2]}" if by_agent else f"u{r[0]}" for r in rows], dtype=object
            )
            traj = np.array([f"t{r[1]}" for r in rows], dtype=object)
            adv, _ = drmas.compute_grpo_outcome_advantage(
                tlr.clone(), mask, index, traj, epsilon=1e-6, norm_adv_by_std_in_grpo=norm,
                group_by_agent_id=by_agent,
            )
            out.append({
                "name": f"{'drmas' if by_agent else 'vanilla'}-{'std' if norm else 'nostd'}",
                "group_by_agent_id": by_agent,
                "norm_adv_by_std": norm,
                "uid": [r[0] for r in rows],
                "traj": [r[1] for r in rows],
                "agent": [r[2] for r in rows],
                "score": [r[3] for r in rows],
                "advantages": adv[:, 0].tolist(),
            })
    return out


def main():
    arl = load("arl_core_algos", sys.argv[1])
    drmas = load("drmas_core_algos", sys.argv[2])
    out = {
        "source": {
            "gigpo": "WillDreamer/ARL-Arena @ a25a2a2 recipe/shop_agent/ppo/core_algos.py",
            "drmas": "langfengQ/DrMAS @ 19c632b verl/trainer/ppo/core_algos.py",
        },
        "torch": torch.__version__,
        "gigpo": gigpo_cases(arl),
        "drmas": drmas_cases(drmas),
    }
    out["gigpo_similarity"], out["sequence_matcher"] = similarity_cases(arl)
    with open(sys.argv[3], "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
