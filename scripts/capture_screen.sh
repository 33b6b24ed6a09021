#!/usr/bin/env bash
# Regenerate docs/screen.txt, the text capture of the dashboard's main screen (docs/dashboard.md).
#
# Runs `graphtop` (the demo model, on whatever `--device auto` picks: the CPU here) in a detached
# 160x45 tmux session, waits for graph capture to finish, sends one prompt, waits for it to finish
# streaming, leaves the input and saves `tmux capture-pane -p`. Then quits with q. Below 120x38 the
# dashboard shows one view at a time: VIEW=1..4 picks the one saved (default 1, the steps).
#
#   scripts/capture_screen.sh [OUT]        (default OUT: docs/screen.txt)
#
# Env: GRAPHTOP (command to run, default: graphtop), GRAPHTOP_CACHE_DIR (default: a temp dir, so the
# demo model is built fresh), WIDTH/HEIGHT (default 160x45), TIMEOUT (seconds per wait, default 300).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT=${1:-docs/screen.txt}
WIDTH=${WIDTH:-160}
HEIGHT=${HEIGHT:-45}
TIMEOUT=${TIMEOUT:-300}
GRAPHTOP=${GRAPHTOP:-graphtop}
PROMPT="Tell me about KV caches."

command -v tmux >/dev/null || { echo "capture_screen.sh: tmux is not installed" >&2; exit 1; }

WORK=$(mktemp -d)
SOCK="graphtop-screen-$$"
export GRAPHTOP_CACHE_DIR=${GRAPHTOP_CACHE_DIR:-$WORK/cache}
export HF_HUB_OFFLINE=1 HF_HUB_DISABLE_PROGRESS_BARS=1 TERM=xterm-256color
unset TMUX

t() { tmux -L "$SOCK" -f /dev/null "$@"; }
SOCK_PATH=""
cleanup() {
  t kill-server 2>/dev/null || true
  [ -n "$SOCK_PATH" ] && rm -f "$SOCK_PATH"  # tmux leaves its socket file behind
  rm -rf "$WORK"
}
trap cleanup EXIT

screen() { t capture-pane -p -t gt 2>/dev/null || true; }
footer() { screen | grep -v '^[[:space:]]*$' | tail -n 1; }

# wait_for DESCRIPTION COMMAND...: poll until COMMAND succeeds, at most $TIMEOUT seconds
wait_for() {
  local what=$1; shift
  local deadline=$((SECONDS + TIMEOUT))
  until "$@"; do
    if screen | grep -q "engine failed"; then
      echo "capture_screen.sh: the engine failed to start" >&2; screen >&2; exit 1
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      echo "capture_screen.sh: timed out waiting for $what" >&2; screen >&2; exit 1
    fi
    sleep 0.25
  done
}

# done: both phase lines ticked (wide layout), or the view bar's capture tab ticked (below 120x38)
captured() {
  { screen | grep -Eq 'decode +[█░]+ ([0-9]+)/\1 .*✓' && screen | grep -Eq 'prefill +[█░]+ ([0-9]+)/\1 .*✓'; } \
    || screen | sed -n 2p | grep -q '3 capture ✓'
}
input_focused() { ! footer | grep -q 'b Buckets'; }
input_left() { footer | grep -q 'b Buckets'; }
typed() { screen | grep -qF "$PROMPT"; }
# The request's header says "done (reason)"; if a long or newline-led completion has scrolled the
# header out of the console's view, the engine panels say it instead: steps ran, nothing running.
finished() {
  local s; s=$(screen)
  if grep -qF " $PROMPT " <<<"$s"; then
    grep -F " $PROMPT " <<<"$s" | grep -q 'done ('
  else
    grep -Eq '[0-9]+ +(decode|prefill) +[0-9]+ +[0-9]+' <<<"$s" && grep -q 'running 0/' <<<"$s" \
      && ! grep -q 'streaming…' <<<"$s"
  fi
}

t new-session -d -s gt -x "$WIDTH" -y "$HEIGHT" \
  "sh -c '$GRAPHTOP; echo EXIT=\$? > $WORK/exit'"
SOCK_PATH=$(t display-message -p '#{socket_path}' 2>/dev/null || true)
t set-option -s escape-time 10

wait_for "graph capture to finish" captured
# Keys bound on the app run once their event has bubbled back up to it, so wait for each key's
# visible effect before sending the keys that depend on it.
t send-keys -t gt /
wait_for "the prompt input to take focus" input_focused
t send-keys -t gt -l "$PROMPT"
wait_for "the prompt to be typed" typed
t send-keys -t gt Enter
wait_for "the completion to finish streaming" finished
t send-keys -t gt Escape
wait_for "the input to lose focus" input_left
t send-keys -t gt "${VIEW:-1}"  # a view key: ignored where everything shows at once
sleep 2  # one more device sample and a settled steps sparkline

mkdir -p "$(dirname "$OUT")"
screen > "$OUT"
echo "wrote $OUT ($(wc -l < "$OUT") lines, ${WIDTH}x${HEIGHT})"

t send-keys -t gt q
deadline=$((SECONDS + 60))
until [ -s "$WORK/exit" ]; do
  [ "$SECONDS" -ge "$deadline" ] && { echo "capture_screen.sh: graphtop did not exit after q" >&2; exit 1; }
  sleep 0.2
done
status=$(cat "$WORK/exit")
[ "$status" = "EXIT=0" ] || { echo "capture_screen.sh: graphtop ended with $status" >&2; exit 1; }
