"""Reads a keel run's TensorBoard folder with the `tensorboard` package's own readers.

Usage: read_tensorboard.py RUN_DIR OUT.json

Writes {"scalars": {tag: [[step, value], ...]}, "texts": {tag: [[step, text], ...]},
"raw": {tag: [step, ...]}}: `scalars`/`texts` as TensorBoard's EventAccumulator serves them,
`raw` every (tag, step) record in the files as its event-file loader reads them (duplicates
included), so a test can tell that no step was written twice.
"""
import glob
import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator, event_file_loader

run_dir, out = sys.argv[1], sys.argv[2]
acc = event_accumulator.EventAccumulator(run_dir, size_guidance={event_accumulator.SCALARS: 0, event_accumulator.TENSORS: 0})
acc.Reload()
tags = acc.Tags()
scalars = {t: [[e.step, e.value] for e in acc.Scalars(t)] for t in tags["scalars"]}
texts = {}
for t in tags["tensors"]:
    texts[t] = [[e.step, e.tensor_proto.string_val[0].decode()] for e in acc.Tensors(t)]
raw = {}
for path in sorted(glob.glob(os.path.join(run_dir, "*tfevents*"))):
    for ev in event_file_loader.LegacyEventFileLoader(path).Load():
        for v in ev.summary.value:
            raw.setdefault(v.tag, []).append(ev.step)
json.dump({"scalars": scalars, "texts": texts, "raw": raw}, open(out, "w"))
