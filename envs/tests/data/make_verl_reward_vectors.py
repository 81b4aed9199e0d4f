"""Writes verl_reward_vectors.json: what verl's own rule-based scorers answer on a set of
responses, so keel's `verifier = "auto"` can be checked against verl (issue 31, VF-3).

    python3 envs/tests/data/make_verl_reward_vectors.py /path/to/verl   # or VERL_ROOT=/path/to/verl

It runs verl's code, it does not copy it: `verl/utils/reward_score/__init__.py` (the real
`default_compute_score`, which picks the scorer by `data_source`), `gsm8k.py` and
`math_reward.py` are loaded from the checkout. Importing the `verl` package itself pulls torch,
tensordict and more, so the two parent packages are stood in for by empty modules (and
`verl.utils.import_utils.deprecated` by a no-op decorator, the only name `__init__.py` imports).
Standard library only.
"""
import importlib.util
import json
import os
import subprocess
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "verl_reward_vectors.json")

GSM8K = "openai/gsm8k"
MATH_SOURCES = ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]

LONG = "#### 72 " + "and then some reasoning goes on. " * 12 + "so no final mark"


def load_reward_score(root):
    """verl.utils.reward_score as a package, its parents stubbed."""
    pkg_dir = os.path.join(root, "verl", "utils", "reward_score")
    if not os.path.isfile(os.path.join(pkg_dir, "gsm8k.py")):
        raise SystemExit(f"{root} is no verl checkout (no verl/utils/reward_score/gsm8k.py)")
    for name in ["verl", "verl.utils"]:
        module = types.ModuleType(name)
        module.__path__ = []
        sys.modules[name] = module
    import_utils = types.ModuleType("verl.utils.import_utils")
    import_utils.deprecated = lambda *a, **k: (lambda fn: fn)
    sys.modules["verl.utils.import_utils"] = import_utils
    spec = importlib.util.spec_from_file_location(
        "verl.utils.reward_score", os.path.join(pkg_dir, "__init__.py"),
        submodule_search_locations=[pkg_dir])
    package = importlib.util.module_from_spec(spec)
    sys.modules["verl.utils.reward_score"] = package
    spec.loader.exec_module(package)
    from verl.utils.reward_score import gsm8k, math_reward  # noqa: E402 (the stubbed package)
    return package, gsm8k, math_reward


# (solution_str, ground_truth): the probes first.
GSM8K_CASES = [
    ("The answer is 3460", "3460"),
    ("#### 3460 dollars for 10 laptops", "3460"),
    ("She pays 10 * 346 = 3460 dollars.\n#### 3460", "3460"),
    ("#### 3,460", "3460"),
    ("#### 3460", "3,460"),
    ("#### $3460", "3460"),
    ("####3460", "3460"),
    ("####  3460", "3460"),
    ("##### 3460", "3460"),
    ("#### -5", "-5"),
    ("#### - 5", "-5"),
    ("#### --5", "-5"),
    ("#### 5-3", "5"),
    ("#### 3.5", "3.5"),
    ("#### 3.50", "3.5"),
    ("#### 72.", "72"),
    ("#### 0072", "72"),
    ("#### 72\n#### 73", "73"),
    ("#### 72\n#### 73", "72"),
    ("#### 72 #### ", "72"),
    ("#### ...", "72"),
    ("#### .", "."),
    ("#### 1,2,3", "123"),
    ("\\boxed{72}", "72"),
    ("The answer is \\boxed{72}. #### 72", "72"),
    ("", "72"),
    ("72", "72"),
    ("answer 72", "72"),
    ("answer #### 72", "72"),
    (" #### 72 ", "72"),
    ("#### ７２", "72"),
    ("#### 72 apples", "72"),
    ("<think>#### 5</think>#### 72", "72"),
    ("<think>#### 72</think>the total is 72", "72"),
    (LONG, "72"),
    ("so " * 120 + "#### 72", "72"),
    ("x is -3.5 and #### -3.5", "-3.5"),
    ("I have 3 apples and 4 pears, so 7.", "7"),
    ("It costs 1,000 dollars", "1000"),
    ("It costs 1,000 dollars", "1,000"),
    ("no numbers at all", "0"),
    (".", "."),
    ("values: 5, 6, .", "6"),
    ("the result is -12", "-12"),
    ("-", "0"),
    ("3 - 4 = -1", "-1"),
    ("e = 2.718...", "2.718..."),
    ("#### 3460\n\nSo she spent 3460 dollars on 10 laptops.", "3460"),
]

MATH_CASES = [
    ("\\boxed{72}", "72"),
    ("The answer is 72", "72"),
    ("so the answer is $\\boxed{72}$.", "72"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}"),
    ("\\boxed{\\tfrac{3}{4}}", "\\frac{3}{4}"),
    ("\\boxed{0.5}", "\\frac{1}{2}"),
    ("\\boxed{.5}", "\\frac{1}{2}"),
    ("\\boxed{1/2}", "\\frac{1}{2}"),
    ("\\boxed{-3/4}", "\\frac{-3}{4}"),
    ("\\boxed{03/4}", "\\frac{3}{4}"),
    ("\\boxed{\\frac12}", "\\frac{1}{2}"),
    ("\\boxed{\\frac1{72}}", "\\frac{1}{72}"),
    ("\\boxed{\\frac{72}1}", "\\frac{72}{1}"),
    ("\\boxed{\\frac}", "\\frac"),
    ("\\boxed{\\frac1}", "\\frac1"),
    ("\\boxed 5", "5"),
    ("\\boxed 5$ and more", "5"),
    ("\\boxed 5 \\boxed{6}", "6"),
    ("\\fbox{5}", "5"),
    ("\\boxed{5", "5"),
    ("\\boxed}{5}", "5"),
    ("\\boxed{x = 5}", "5"),
    ("\\boxed{k=5}", "5"),
    ("\\boxed{abc = 5}", "5"),
    ("\\boxed{a=b=5}", "5"),
    ("\\boxed{10\\%}", "10"),
    ("\\boxed{90^\\circ}", "90"),
    ("\\boxed{90^{\\circ}}", "90"),
    ("\\boxed{\\$5}", "5"),
    ("\\boxed{5 \\text{ cm}}", "5"),
    ("\\boxed{5\\text{ cm} + 2\\text{ m}}", "5\\text{ cm} + 2\\text{ m}"),
    ("\\boxed{\\sqrt3}", "\\sqrt{3}"),
    ("\\boxed{2\\sqrt}", "2\\sqrt"),
    ("\\boxed{2\\sqrt}", "2"),
    ("\\boxed{\\left( 1,2 \\right)}", "(1,2)"),
    ("\\boxed{1,000}", "1000"),
    ("\\boxed{}", "0"),
    ("", "72"),
    ("\\boxed{a}\\boxed{b}", "b"),
    ("\\boxed{{5}}", "{5}"),
    ("\\boxed{-3}", "-3"),
    ("\\boxed{ 7 }", "7"),
    ("\\boxed{7\n}", "7"),
    ("\\boxed{\\!7}", "7"),
    ("\\boxed{x^2+1}", "x^2 + 1"),
    ("\\boxed{x^2+2}", "x^2 + 1"),
    ("\\boxed{é}", "é"),
    ("\\boxed{5} \\fbox{6}", "5"),
    ("\\fbox{6} then \\boxed{5}", "5"),
    ("\\boxed{\\\\frac{1}{2}}", "\\frac{1}{2}"),
    ("<think>\\boxed{4}</think>\\boxed{5}", "5"),
    ("\\boxed{\\text{(A)}}", "\\text{(A)}"),
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}"),
    ("\\boxed{0.50}", "\\frac{1}{2}"),
    ("\\boxed{3.14}", "3.14"),
    ("answer: \\boxed{(-\\infty, 2]}", "(-\\infty,2]"),
]

STRIP_INPUTS = [
    "", " ", ".5", "0.5", "1/2", "-1/2", "+1/2", "01/2", "1/2/3", "a/b", "\\frac12", "\\frac1{72}",
    "\\frac{1}{2}", "\\frac", "\\frac1", "\\frac{", "\\dfrac{3}{4}", "\\sqrt3", "\\sqrt{3}",
    "2\\sqrt", "\\sqrté", "x = 5", "xyz = 5", "a=b=c", "=5", "5 \\text{ cm}",
    "\\text{ a}\\text{ b}", "10\\%", "10\\\\%", "90^\\circ", "\\left(1,2\\right)", "\\$5",
    " .5", "{.5}", "1\n2", "\\!1", "\\\\frac{1}{2}", "é = 1", "ab=1", "\\frac{é}2", "\\fracé2",
]


def verl_commit(root):
    try:
        return subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.environ.get("VERL_ROOT", "")
    if not root:
        raise SystemExit(__doc__)
    package, gsm8k, math_reward = load_reward_score(root)
    vectors = []
    for solution, truth in GSM8K_CASES:
        vectors.append({"scorer": "default_compute_score", "data_source": GSM8K,
                        "solution_str": solution, "ground_truth": truth,
                        "score": float(package.default_compute_score(GSM8K, solution, truth))})
        for method, format_score, score in [("strict", 0.1, 1.0), ("flexible", 0.0, 1.0),
                                            ("flexible", 0.25, 2.0)]:
            vectors.append({"scorer": "gsm8k", "method": method, "format_score": format_score,
                            "score_value": score, "solution_str": solution,
                            "ground_truth": truth,
                            "score": float(gsm8k.compute_score(solution, truth, method=method,
                                                               format_score=format_score,
                                                               score=score))})
    for i, (solution, truth) in enumerate(MATH_CASES):
        source = MATH_SOURCES[i % len(MATH_SOURCES)]
        vectors.append({"scorer": "default_compute_score", "data_source": source,
                        "solution_str": solution, "ground_truth": truth,
                        "score": float(package.default_compute_score(source, solution, truth))})
    for text in STRIP_INPUTS + [t for _, t in MATH_CASES]:
        try:
            stripped = math_reward.strip_string(text)
        except Exception:  # verl's is_equiv falls back to plain equality then
            stripped = None
        vectors.append({"scorer": "strip_string", "input": text, "output": stripped})
    doc = {"generated_by": "envs/tests/data/make_verl_reward_vectors.py",
           "verl_commit": verl_commit(root), "vectors": vectors}
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1, ensure_ascii=False)
        f.write("\n")
    counts = {}
    for v in vectors:
        counts[v["scorer"]] = counts.get(v["scorer"], 0) + 1
    print(f"wrote {OUT}: {counts}")


if __name__ == "__main__":
    main()
