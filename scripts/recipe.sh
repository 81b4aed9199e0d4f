#!/usr/bin/env bash
# Runs one method recipe from recipes/ end to end: sets up the machine, builds keel (release) and
# trains with recipes/<NAME>.toml into runs/<NAME> (resumed if it already holds a checkpoint).
#   ./scripts/recipe.sh sampo            # or sao, armor, so_ppo, so_grpo, rtpo, dr_mas, pats
# Extra arguments go to `keel train` (e.g. --run-root s3://bucket/prefix, --steps 20).
set -euo pipefail
cd "$(dirname "$0")/.."
name=${1:-}
if [ -z "$name" ] || [ ! -f "recipes/$name.toml" ]; then
  echo "usage: $0 NAME [keel train args...]; recipes: $(cd recipes && ls *.toml | sed 's/\.toml$//' | tr '\n' ' ')" >&2
  exit 2
fi
shift
. scripts/setup.sh
cargo build --release -p keel-ops
exec target/release/keel train --config "recipes/$name.toml" --run-root "runs/$name" "$@"
