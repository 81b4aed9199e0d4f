#!/usr/bin/env bash
# Sets up the machine and runs every test of the workspace (unit, integration, S3 against a real
# SeaweedFS server on loopback).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup.sh
export RUST_BACKTRACE=1
cargo build -p keel-ops   # integration tests drive the real `keel` binary (target/debug/keel)
. scripts/seaweedfs.sh
trap seaweed_stop EXIT
if cargo nextest --version >/dev/null 2>&1; then
  cargo nextest run --workspace --no-fail-fast "$@"
else
  cargo test --workspace --no-fail-fast "$@"
fi
