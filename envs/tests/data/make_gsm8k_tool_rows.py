"""Writes `gsm8k_tool_rows.parquet`: verl multi-turn tool rows made by verl's own
`examples/data_preprocess/gsm8k_multiturn_w_tool.py` logic on a few hand-written gsm8k-style
question/answer pairs (the real dataset needs network access and `datasets`).

verl's script defines `extract_solution` and, under `if __name__ == "__main__":`, the
`data_source`, `instruction_following` and `make_map_fn(split)` -> `process_fn(example, idx)`
it maps over the HF dataset; it imports `datasets` and `verl.utils.hdfs_io` at the top, so it
cannot be imported. This script takes exactly those definitions out of the script's syntax
tree and runs them unchanged, then writes the rows with pyarrow as `datasets.to_parquet` does
(one Arrow table, structs inferred across rows).

    python3 envs/tests/data/make_gsm8k_tool_rows.py [VERL_DIR]   # default /tmp/verl; needs pyarrow
"""
import ast
import os
import re
import sys

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
VERL = sys.argv[1] if len(sys.argv) > 1 else "/tmp/verl"
SCRIPT = os.path.join(VERL, "examples/data_preprocess/gsm8k_multiturn_w_tool.py")

# gsm8k-style pairs: the `answer` ends with `#### N`, as in openai/gsm8k.
PAIRS = [
    ("Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
     "How many clips did Natalia sell altogether in April and May?",
     "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
     "Natalia sold 48+24 = <<48+24=72>>72 clips altogether in April and May.\n#### 72"),
    ("Tom has 3 apples and buys 4 more. How many apples does he have?",
     "Tom has 3 + 4 = <<3+4=7>>7 apples.\n#### 7"),
    ("A shop sells pens at 2 dollars each. How much do 15 pens cost?",
     "15 pens cost 15 * 2 = <<15*2=30>>30 dollars.\n#### 30"),
    ("A farm has 1,200 hens and sells 250 of them. How many hens are left?",
     "1,200 - 250 = <<1200-250=950>>950 hens are left.\n#### 950"),
]


def verl_definitions():
    """verl's `extract_solution`, `data_source`, `instruction_following` and `make_map_fn`."""
    tree = ast.parse(open(SCRIPT).read(), SCRIPT)
    keep = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "extract_solution"]
    main = next(n for n in tree.body if isinstance(n, ast.If))
    for node in main.body:
        targets = [t.id for t in getattr(node, "targets", []) if isinstance(t, ast.Name)]
        if {"data_source", "instruction_following"} & set(targets):
            keep.append(node)
        if isinstance(node, ast.FunctionDef) and node.name == "make_map_fn":
            keep.append(node)
    assert len(keep) == 4, [getattr(n, "name", None) for n in keep]
    namespace = {"re": re}
    exec(compile(ast.Module(body=keep, type_ignores=[]), SCRIPT, "exec"), namespace)
    return namespace


def main():
    verl = verl_definitions()
    process_fn = verl["make_map_fn"]("train")
    rows = [process_fn({"question": q, "answer": a}, i) for i, (q, a) in enumerate(PAIRS)]
    table = pa.Table.from_pylist(rows)
    pq.write_table(table, os.path.join(HERE, "gsm8k_tool_rows.parquet"))
    print(table.schema)


if __name__ == "__main__":
    main()
