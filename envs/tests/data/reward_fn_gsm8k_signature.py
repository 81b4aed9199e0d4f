"""Test reward function with the signature of verl's per-source scorers (verl's
`reward_score/gsm8k.py`): `compute_score(solution_str, ground_truth, method, format_score,
score)`, no `data_source`. Strict: the word after the last `####`; flexible: the last word.
"""


def compute_score(solution_str, ground_truth, method="strict", format_score=0.0, score=1.0):
    words = solution_str.replace(",", "").split()
    if method == "strict":
        marks = [i for i, w in enumerate(words) if w == "####" and i + 1 < len(words)]
        answer = words[marks[-1] + 1] if marks else None
    else:
        answer = words[-1] if words else None
    if answer is None:
        return 0
    return score if answer == ground_truth else format_score
