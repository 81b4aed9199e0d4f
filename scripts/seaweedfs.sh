#!/usr/bin/env bash
# Starts a SeaweedFS S3 server on loopback for tests (sourced by scripts/test.sh).
# Exports KEEL_TEST_S3_ENDPOINT, AWS_* credentials for it, and SEAWEED_PID; `seaweed_stop` stops it.
# Always bound to 127.0.0.1 (never the machine's own address).
set -euo pipefail

SEAWEED_DIR=$(mktemp -d "${TMPDIR:-/tmp}/keel-seaweed.XXXXXX")
SEAWEED_S3_PORT=${SEAWEED_S3_PORT:-18333}
cat > "$SEAWEED_DIR/s3.json" <<JSON
{"identities":[{"name":"keel","credentials":[{"accessKey":"keel-test","secretKey":"keel-test-secret"}],"actions":["Admin","Read","Write","List","Tagging"]}]}
JSON
mkdir -p "$SEAWEED_DIR/data"
weed mini -dir="$SEAWEED_DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 -s3.config="$SEAWEED_DIR/s3.json" \
  -admin.ui=false -webdav=false -master.port=18330 -volume.port=18331 -filer.port=18332 \
  -s3.port="$SEAWEED_S3_PORT" >"$SEAWEED_DIR/weed.log" 2>&1 &
SEAWEED_PID=$!
for _ in $(seq 1 60); do
  if curl -s -o /dev/null "http://127.0.0.1:$SEAWEED_S3_PORT/" 2>/dev/null; then break; fi
  sleep 0.5
done
if ! curl -s -o /dev/null "http://127.0.0.1:$SEAWEED_S3_PORT/"; then
  echo "seaweedfs did not start; log:" >&2; tail -20 "$SEAWEED_DIR/weed.log" >&2; exit 1
fi
export SEAWEED_PID SEAWEED_DIR
export KEEL_TEST_S3_ENDPOINT="http://127.0.0.1:$SEAWEED_S3_PORT"
export KEEL_TEST_S3_BUCKET=keel-test
export AWS_ACCESS_KEY_ID=keel-test AWS_SECRET_ACCESS_KEY=keel-test-secret AWS_REGION=us-east-1
export AWS_ENDPOINT_URL="$KEEL_TEST_S3_ENDPOINT" AWS_ALLOW_HTTP=true
seaweed_stop() { kill "$SEAWEED_PID" 2>/dev/null || true; wait "$SEAWEED_PID" 2>/dev/null || true; rm -rf "$SEAWEED_DIR"; }
echo "seaweedfs S3 on $KEEL_TEST_S3_ENDPOINT (pid $SEAWEED_PID)" >&2
