# Sourced by the resume tests (train_resume.sh, train_stream.sh): stops a running mpirun at a random moment.
#   stop_at_random HOW PID DONE_FILE MAX_DELAY_MS
# waits until DONE_FILE exists (a checkpoint is complete) or mpirun PID has ended, sleeps a random 0 ..
# MAX_DELAY_MS ms, then "crash" kills the ranks (SIGKILL, by the pids of mpirun's children) and "signal" sends
# SIGTERM to mpirun (forwarded to the ranks, as on Slurm preemption); waits for mpirun (so call it in the shell
# that started it, not in a $(...) subshell) and sets stop_delay_ms.
stop_at_random() {
  local how="$1" pid="$2" done_file="$3" max_ms="$4"
  while [ ! -f "$done_file" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.02; done
  local ms=$(( RANDOM % (max_ms + 1) ))
  sleep "$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))"
  if [ "$how" = crash ]; then
    local kids; kids=$(pgrep -P "$pid" || true)
    # shellcheck disable=SC2086
    [ -n "$kids" ] && kill -KILL $kids 2>/dev/null || true
  else
    kill -TERM "$pid" 2>/dev/null || true
  fi
  wait "$pid" 2>/dev/null || true
  stop_delay_ms=$ms
}
