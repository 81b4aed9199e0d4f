"""Test reward function with verl's custom signature, its parameters in another order than
verl's positional one: only a call by keyword (as verl makes it) passes the right values.

The reward is the length in characters of the `solution_str` it received plus `offset` (a
`--reward-kwargs` value), so a test reads back exactly what verl would pass (untrimmed, a
leading `answer` word, reasoning) and sees rewards outside [0, 1]; the response `nan` scores NaN.
"""


def compute_score(solution_str, ground_truth, data_source, extra_info=None, *, offset=0.0):
    assert data_source == "probe", f"data_source {data_source!r}"
    if solution_str.strip() == "nan":
        return float("nan")
    return {"score": len(solution_str) + offset, "ground_truth": ground_truth}
