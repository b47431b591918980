#!/bin/bash
# One node of the fleet: an SGLang server on this node's GPUs and the worker bound to it
# (SGLANG_URLS=http://localhost:$SGLANG_PORT). On SIGTERM (Slurm's --signal before the time
# limit, or scancel --signal=TERM) only the worker is told: it drains for up to
# FLEET_SHUTDOWN_GRACE seconds with its server still up, hands back what is left and exits;
# then the server is stopped. SGLANG_CMD replaces the server's command (tests use the stand-in).
set -uo pipefail

SGLANG_PORT=${SGLANG_PORT:-30000}
LOGS=${RUN_DIR:-.}/logs
mkdir -p "$LOGS"
node=$(hostname --short)
server_cmd=${SGLANG_CMD:-python -m sglang.launch_server --model-path "$MODEL_PATH" --served-model-name "$SERVED_MODEL" --tp "$TP_SIZE" --host 127.0.0.1 --port "$SGLANG_PORT" --enable-metrics}

bash -c "exec $server_cmd" > "$LOGS/sglang-$node.log" 2>&1 &
server=$!
worker=
stop() { [[ -n "$worker" ]] && kill -TERM "$worker" 2>/dev/null; stopping=1; }
stopping=0
trap stop TERM INT

# The worker takes prompts only while its server answers /health with 200, so it may start
# at once; waiting here keeps its log quiet while the weights load.
until [[ $stopping == 1 ]] || curl -fsS -o /dev/null --max-time 5 "http://localhost:$SGLANG_PORT/health"; do
    kill -0 "$server" 2>/dev/null || { echo "sglang exited while loading: see $LOGS/sglang-$node.log" >&2; exit 1; }
    sleep 5
done

if [[ $stopping == 0 ]]; then
    export SGLANG_URLS="http://localhost:$SGLANG_PORT"
    # No gossip, no mingle: they grow with the square of the fleet (the app drops them anyway).
    celery -A workers worker -l INFO -n gen@%h --without-gossip --without-mingle > "$LOGS/worker-$node.log" 2>&1 &
    worker=$!
    # `wait` returns early when a trapped signal arrives: wait again until the worker has exited.
    while :; do
        wait "$worker"; status=$?
        kill -0 "$worker" 2>/dev/null || break
    done
else
    status=0
fi
kill -TERM "$server" 2>/dev/null
wait "$server" 2>/dev/null
exit "$status"
