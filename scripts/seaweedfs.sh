#!/usr/bin/env bash
# Starts a SeaweedFS S3 server on loopback for tests (sourced by scripts/test.sh).
# Exports KEEL_TEST_S3_ENDPOINT, AWS_* credentials for it, and SEAWEED_PID; `seaweed_stop` stops it.
# Always bound to 127.0.0.1 (never the machine's own address).
set -euo pipefail

SEAWEED_DIR=$(mktemp -d "${TMPDIR:-/tmp}/keel-seaweed.XXXXXX")
# Free loopback ports chosen at run time (several test runs may share a machine). SeaweedFS also
# listens on each port + 10000 (gRPC), so both must be free and below 65536.
read -r SEAWEED_MASTER_PORT SEAWEED_VOLUME_PORT SEAWEED_FILER_PORT SEAWEED_FREE_S3 < <(python3 - <<'PY'
import random, socket
def free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p)); return True
    except OSError:
        return False
    finally:
        s.close()
picked = []
while len(picked) < 4:
    p = random.randint(20000, 45000)
    # Neither p nor its gRPC port p + 10000 may be a port (or gRPC port) already picked.
    if all(p not in (q, q + 10000, q - 10000) for q in picked) and free(p) and free(p + 10000):
        picked.append(p)
print(*picked)
PY
)
# Never inherit a port from an enclosing run (it would be taken); KEEL_SEAWEED_S3_PORT pins one.
SEAWEED_S3_PORT=${KEEL_SEAWEED_S3_PORT:-$SEAWEED_FREE_S3}
cat > "$SEAWEED_DIR/s3.json" <<JSON
{"identities":[{"name":"keel","credentials":[{"accessKey":"keel-test","secretKey":"keel-test-secret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
mkdir -p "$SEAWEED_DIR/data"
# Volumes sized for tests, not for the disk: left to itself `weed mini` sizes its volumes (64 MB to
# 1 GB) and their count (free disk / volume size) from the free disk at start, and on a nearly
# full disk it runs out of writable volumes part-way through a test run and stalls every write
# after that. A test run stores ~150 MB in all; 100 volumes of 64 MB are sparse files.
weed mini -dir="$SEAWEED_DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3.config="$SEAWEED_DIR/s3.json" \
  -master.volumeSizeLimitMB=64 -volume.max=100 \
  -admin.ui=false -webdav=false -s3.port.iceberg=0 -s3.port.lance=0 -master.port="$SEAWEED_MASTER_PORT" -volume.port="$SEAWEED_VOLUME_PORT" \
  -filer.port="$SEAWEED_FILER_PORT" \
  -s3.port="$SEAWEED_S3_PORT" >"$SEAWEED_DIR/weed.log" 2>&1 &
SEAWEED_PID=$!
for _ in $(seq 1 120); do  # up to 60 s: a loaded CI machine starts it slowly
  if curl -s -o /dev/null "http://127.0.0.1:$SEAWEED_S3_PORT/" 2>/dev/null; then break; fi
  sleep 0.5
done
if ! curl -s -o /dev/null "http://127.0.0.1:$SEAWEED_S3_PORT/"; then
  echo "seaweedfs did not start; log:" >&2; tail -20 "$SEAWEED_DIR/weed.log" >&2; exit 1
fi
# Create the test bucket up front: auto-creation on first write races when many tests start at once.
for _ in $(seq 1 20); do
  if ! kill -0 "$SEAWEED_PID" 2>/dev/null; then
    echo "seaweedfs exited; log:" >&2; tail -20 "$SEAWEED_DIR/weed.log" >&2; exit 1
  fi
  if echo "s3.bucket.create -name keel-test" | timeout 10 weed shell -master="127.0.0.1:$SEAWEED_MASTER_PORT" >>"$SEAWEED_DIR/weed.log" 2>&1 \
     && echo "s3.bucket.list" | timeout 10 weed shell -master="127.0.0.1:$SEAWEED_MASTER_PORT" 2>/dev/null | grep -q keel-test; then
    break
  fi
  sleep 0.5
done
export SEAWEED_PID SEAWEED_DIR SEAWEED_MASTER_PORT SEAWEED_VOLUME_PORT SEAWEED_FILER_PORT SEAWEED_S3_PORT
export KEEL_TEST_S3_ENDPOINT="http://127.0.0.1:$SEAWEED_S3_PORT"
export KEEL_TEST_S3_BUCKET=keel-test
export AWS_ACCESS_KEY_ID=keel-test AWS_SECRET_ACCESS_KEY=keel-test-secret AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="$KEEL_TEST_S3_ENDPOINT" AWS_ALLOW_HTTP=true
# On a failed run, says whether the server was still alive and what it logged last (an S3 test
# that times out is otherwise silent about the server side), with the disk it wrote to.
seaweed_stop() {
  local status=$?
  if [ "$status" -ne 0 ]; then
    if kill -0 "$SEAWEED_PID" 2>/dev/null; then echo "seaweedfs was alive at exit" >&2; else echo "seaweedfs had exited" >&2; fi
    echo "seaweedfs data: $(du -sh "$SEAWEED_DIR/data" 2>/dev/null | cut -f1); disk: $(df -h "$SEAWEED_DIR" | tail -1)" >&2
    tail -40 "$SEAWEED_DIR/weed.log" >&2 || true
  fi
  kill "$SEAWEED_PID" 2>/dev/null || true; wait "$SEAWEED_PID" 2>/dev/null || true; rm -rf "$SEAWEED_DIR"
}
echo "seaweedfs S3 on $KEEL_TEST_S3_ENDPOINT (pid $SEAWEED_PID)" >&2
