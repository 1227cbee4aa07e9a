#!/usr/bin/env bash
# Train profiles one at a time from a queue file, so jobs never compete for the 2 CPU cores.
#
#   profiles/recipes/run_queue.sh QUEUE_FILE LOG_DIR
#
# QUEUE_FILE holds one job per line: "<name> <command ...>" (run from the repo root). Lines may
# be appended while the queue runs; a job is done once its name is in QUEUE_FILE.done. When no
# job is pending the runner polls for 20 minutes, then exits. Logs go to LOG_DIR/<name>.log.
set -u
queue=$1
logs=$2
done_file="$queue.done"
cd "$(dirname "$0")/../.." || exit 1
mkdir -p "$logs"
touch "$done_file"
idle=0
while [ "$idle" -lt 20 ]; do
  job=$(grep -v '^\s*\(#\|$\)' "$queue" | while read -r name cmd; do
          grep -qx "$name" "$done_file" || { echo "$name $cmd"; break; }
        done)
  if [ -z "$job" ]; then
    idle=$((idle + 1))
    sleep 60
    continue
  fi
  idle=0
  name=${job%% *}
  cmd=${job#* }
  echo "$(date -u +%FT%TZ) start $name: $cmd" >> "$logs/queue.log"
  bash -c "$cmd" > "$logs/$name.log" 2>&1
  rc=$?
  echo "$(date -u +%FT%TZ) end $name rc=$rc" >> "$logs/queue.log"
  echo "$name" >> "$done_file"
done
