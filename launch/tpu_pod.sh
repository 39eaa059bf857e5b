#!/usr/bin/env bash
# Pretrain on a Cloud TPU VM pod slice: create it, install bertjax on every worker, run the same
# command on all of them, follow, stop, delete.
#
#   REPO_URL=https://github.com/<you>/bertjax.git WORKDIR=gs://<bucket>/bertjax/base \
#     launch/tpu_pod.sh up            # create + install + run (detached)
#   launch/tpu_pod.sh logs            # follow worker 0 (the one that logs)
#   launch/tpu_pod.sh stop            # SIGTERM everywhere: save a checkpoint at the same step, exit
#   launch/tpu_pod.sh run             # again: resumes from the workdir's latest checkpoint
#   launch/tpu_pod.sh delete
#
# Commands: create | install | run | up (create, install, run) | logs | stop | ssh CMD... | delete
# Every setting is an environment variable with a default below; the ones marked FILL IN have none
# that can work. Requires the gcloud CLI, logged in, with the TPU API enabled in the project.
#
# How the workers find each other: nothing to configure. `python -m bertjax.train` calls
# jax.distributed.initialize() on a TPU VM, and JAX reads the worker list and this worker's index
# from the VM's metadata (bertjax/training/sharding.py). Every worker runs the identical command; worker 0
# writes metrics and the others read their share of the data.
#
# Not run in CI (it needs a Google Cloud project); written against the gcloud compute tpus tpu-vm
# commands. Check the runtime version for your TPU generation before the first use.

set -euo pipefail

# --- The slice ---------------------------------------------------------------------------------
TPU_NAME="${TPU_NAME:-bertjax-pod}"
ZONE="${ZONE:-us-central2-b}"                  # where your TPU quota is
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v4-32}"  # v4-32 = 16 chips on 4 workers; v5litepod-16, v5p-32, v6e-16 ...
# The TPU VM software version. It must suit the generation: v4 tpu-ubuntu2204-base, v5e
# v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, v6e v2-alpha-tpuv6e (see Cloud TPU "TPU software versions").
RUNTIME_VERSION="${RUNTIME_VERSION:-tpu-ubuntu2204-base}"
PROJECT="${PROJECT:-}"                         # empty: gcloud's configured project
SPOT="${SPOT:-0}"                              # 1: a Spot slice (cheaper, preemptible; see "Preemption")

# --- The code on the workers -------------------------------------------------------------------
REPO_URL="${REPO_URL:-FILL_IN_REPO_URL}"       # FILL IN: a git URL every worker can clone
REPO_REF="${REPO_REF:-main}"
PYTHON="${PYTHON:-python3.11}"                 # bertjax needs 3.11+; Ubuntu 22.04 images ship 3.10
REMOTE_DIR="${REMOTE_DIR:-bertjax}"            # clone, under the worker's home directory
VENV="${VENV:-bertjax-venv}"                   # virtual environment, under the home directory

# --- The run -----------------------------------------------------------------------------------
CONFIG="${CONFIG:-configs/base.py}"
# FILL IN: a directory every worker sees. Checkpoints of several processes are written into one
# directory by all of them, so a worker-local disk does not work; a gs:// bucket does (the VMs'
# service account needs write access to it). metrics.jsonl and TensorBoard files are written with
# plain file I/O by worker 0: with a gs:// workdir they land in ~/$REMOTE_DIR/gs:/... on worker 0
# (copy them out, or use a Cloud Storage FUSE mount as the workdir).
WORKDIR="${WORKDIR:-gs://FILL_IN_BUCKET/bertjax/base}"
# More flags for bertjax.train, e.g. the data: a corpus prepared once with python -m bertjax.prepare
# into a bucket carries its vocabulary and is read by every worker with tf.io.gfile:
#   EXTRA_FLAGS="--config.data.source=prepared --config.data.prepared_dir=gs://<bucket>/corpus-prepared"
# (source=text reads local files: each worker would need its own copy of the corpus.)
EXTRA_FLAGS="${EXTRA_FLAGS:-}"
LOG="${LOG:-bertjax-train.log}"                # on each worker, under the home directory
PID_FILE="${PID_FILE:-bertjax-train.pid}"

usage() {
  sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-0}"
}

gcloud_tpu() {
  gcloud compute tpus tpu-vm "$@" --zone="$ZONE" ${PROJECT:+--project="$PROJECT"}
}

# One command on every worker at once (each gets the same string).
on_all_workers() {
  gcloud_tpu ssh "$TPU_NAME" --worker=all --command="$1"
}

require_filled() {
  local name value
  for name in "$@"; do
    value="${!name}"
    if [[ "$value" == *FILL_IN* ]]; then
      echo "tpu_pod.sh: set $name (now '$value'); see the top of $0" >&2
      exit 2
    fi
  done
}

create() {
  gcloud_tpu create "$TPU_NAME" --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" \
    $([[ "$SPOT" == 1 ]] && echo --spot)
}

install() {
  require_filled REPO_URL
  # jax[tpu] after the package: it brings the libtpu that matches the jax the package resolved.
  on_all_workers "set -euo pipefail
    if ! command -v $PYTHON >/dev/null; then
      sudo apt-get update -qq && sudo apt-get install -y -qq ${PYTHON} ${PYTHON}-venv
    fi
    if [[ ! -d ~/$REMOTE_DIR/.git ]]; then git clone -q $(printf %q "$REPO_URL") ~/$REMOTE_DIR; fi
    cd ~/$REMOTE_DIR && git fetch -q origin && git checkout -q $(printf %q "$REPO_REF") \
      && { git pull -q --ff-only || true; }
    [[ -d ~/$VENV ]] || $PYTHON -m venv ~/$VENV
    ~/$VENV/bin/pip install -q -U pip
    ~/$VENV/bin/pip install -q -e .
    ~/$VENV/bin/pip install -q -U 'jax[tpu]'
    ~/$VENV/bin/python -c 'import bertjax, jax; print(\"bertjax with jax\", jax.__version__)'"
}

# exec: the pid that `run` records is then python's own, which `stop` must reach (a shell in
# between would die of the SIGTERM and leave python running).
train_command() {
  printf 'cd ~/%s && exec ~/%s/bin/python -m bertjax.train --config=%q --workdir=%q %s' \
    "$REMOTE_DIR" "$VENV" "$CONFIG" "$WORKDIR" "$EXTRA_FLAGS"
}

# Detached (nohup): the run outlives this ssh session. Its pid is kept for `stop`.
run() {
  require_filled WORKDIR
  on_all_workers "set -euo pipefail
    if [[ -f ~/$PID_FILE ]] && kill -0 \$(cat ~/$PID_FILE) 2>/dev/null; then
      echo \"\$(hostname): already training (pid \$(cat ~/$PID_FILE)); launch/tpu_pod.sh stop first\" >&2; exit 1
    fi
    nohup bash -c $(printf %q "$(train_command)") >> ~/$LOG 2>&1 < /dev/null &
    echo \$! > ~/$PID_FILE
    echo \"\$(hostname): training, pid \$!, log ~/$LOG\""
  echo "follow it with: $0 logs"
}

logs() {
  gcloud_tpu ssh "$TPU_NAME" --worker=0 --command="tail -n 200 -F ~/$LOG"
}

# SIGTERM to every worker's process: bertjax.train agrees on a step across processes, saves, exits 0.
stop() {
  on_all_workers "if [[ -f ~/$PID_FILE ]] && kill -0 \$(cat ~/$PID_FILE) 2>/dev/null; then
      kill -TERM \$(cat ~/$PID_FILE) && echo \"\$(hostname): SIGTERM sent; saving\"
    else echo \"\$(hostname): not training\"; fi"
}

delete() {
  gcloud_tpu delete "$TPU_NAME" --quiet
}

# Preemption: a Spot slice can be taken back at any time. Its processes get SIGTERM first, and
# bertjax.train saves when it can; the slice is then PREEMPTED and must be deleted and created
# again (`delete`, then `up`): the run resumes from the workdir's latest checkpoint, which is why
# the workdir must outlive the VMs (a bucket).

case "${1:-}" in
  create) create ;;
  install) install ;;
  run) run ;;
  up) create && install && run ;;
  logs) logs ;;
  stop) stop ;;
  ssh) shift; on_all_workers "$*" ;;
  delete) delete ;;
  -h|--help|help) usage 0 ;;
  *) usage 2 ;;
esac
