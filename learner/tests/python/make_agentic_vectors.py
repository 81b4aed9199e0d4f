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
`build_step_group` (exact anchors; the similarity option is not in keel yet).
"""
import importlib.util
import json
import sys
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


def gigpo_cases(arl):
    penalty = 0.1
    rows = gigpo_records()
    n, length = len(rows), 4
    scores = [r[3] - (penalty if r[5] else 0.0) for r in rows]
    step_rewards = [r[4] - (penalty if r[5] else 0.0) for r in rows]
    batch = SimpleNamespace(
        non_tensor_batch={
            "rewards": np.array(step_rewards, dtype=np.float64),
            "traj_uid": np.array([f"t{r[1]}" for r in rows], dtype=object),
            "active_masks": np.ones(n, dtype=bool),
        },
        batch={"input_ids": torch.zeros(n, 1)},
    )
    out = []
    for gamma in [0.95, 1.0]:
        returns = arl.compute_step_discounted_returns(batch, gamma)
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
    with open(sys.argv[3], "w") as f:
        json.dump(out, f, indent=0)
        f.write("\n")


if __name__ == "__main__":
    main()
