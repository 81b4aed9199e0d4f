"""Test reward function that fits no verl signature (verl always passes `extra_info=`): the
reference server must refuse it at startup and say so on /health."""


def compute_score(data_source, solution_str, ground_truth):
    return 1.0
