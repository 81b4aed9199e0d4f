#!/usr/bin/env bash
# Store benchmark (BENCHMARKS.md): checkpoint commit and resume vs raw disk I/O, S3 commit vs plain
# puts (SeaweedFS on loopback), rollout-batch codec vs memcpy / serde_json / bincode. One command:
#   bash scripts/bench_store.sh            (KEEL_BENCH_MB=256 by default)
set -euo pipefail
cd "$(dirname "$0")/.."
export LIBTORCH_USE_PYTORCH=1
. scripts/seaweedfs.sh
trap seaweed_stop EXIT
cargo bench -p keel-store --bench store_bench
