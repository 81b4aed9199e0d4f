"""Writes the dataset fixtures of keel-envs' tests the way verl's data preprocessing does
(`examples/data_preprocess/gsm8k.py`: a HF `datasets` table written with pyarrow), so the
Parquet reader is checked against files from the same writer users' files come from.

    python3 envs/tests/data/make_fixtures.py   # needs pyarrow (scripts/setup.sh installs it)
"""
import os

import pyarrow as pa
import pyarrow.parquet as pq

HERE = os.path.dirname(os.path.abspath(__file__))
INSTRUCTION = "Let's think step by step and output the final answer after \"####\"."


def gsm8k_like(split, n):
    rows = []
    for i in range(n):
        a, b = i + 2, 3 * i + 1
        question = f"Tom has {a} apples and buys {b} more. How many apples does he have?"
        rows.append({
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": question + " " + INSTRUCTION}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(a + b)},
            "extra_info": {"split": split, "index": i, "answer": f"{a} + {b} = {a + b} #### {a + b}",
                           "question": question},
        })
    return rows


def write(name, rows):
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(HERE, name), compression="snappy")


write("gsm8k_train.parquet", gsm8k_like("train", 6))
write("gsm8k_test.parquet", gsm8k_like("test", 3))
