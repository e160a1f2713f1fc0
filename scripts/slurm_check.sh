#!/usr/bin/env bash
# Run the README's Slurm array job (scripts/grade_array.sbatch, unchanged) on a throwaway one-node Slurm
# cluster and check what it grades.
#
#   scripts/slurm_check.sh          as root, with Debian's slurm-wlm and munge installed, after `make venv`
#
# Everything lives in one temporary directory (SLURM_CHECK_TMP, default $TMPDIR or /tmp): slurm.conf (this host
# as controller and compute node, 2 CPUs, free ports on 127.0.0.1), the munge key, socket, pid and log files,
# Slurm's state, spool, logs and job-completion log, the class and the grades. munged, slurmctld and slurmd run
# in the foreground as children of this script; nothing outside the directory is configured. At the end, also
# on failure or Ctrl-C, the jobs are cancelled, the daemons stopped (any process left with this cluster's
# SLURM_CONF in its environment is killed) and the directory removed (SLURM_CHECK_KEEP=1 keeps it).
#
# Steps: a class of 4 students x 2 notebooks; `make grade` of it on this machine; the array job with
# --array=1-3 (each task 1 CPU); sacct shows tasks 1-3 COMPLETED; each student is in exactly one shard, graded
# once; the merge equals the single-machine sheet byte for byte, and `merge -o FOLDER` the single machine's OUT
# (sheets, gradebook, LMS import files, feedback pages, review sheet, report). Then a failing task: `sbatch
# --array=2` into a folder holding the first job's shards 1 and 3, where shard 2's output folder cannot be made (a
# file is in the way: root writes into any folder); sacct shows task 2 FAILED, the merge exits 1 naming shard 2's
# students and writes nothing; `sbatch --array=2` again, the way cleared, re-runs that shard and the merge then
# equals the single-machine sheet. Exit status 0 when every check passed.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=$REPO/.venv/bin/python
SHARDS=3
DEADLINE=$((SECONDS + ${SLURM_CHECK_SECONDS:-280}))

log() { printf '[slurm-check %3d s] %s\n' "$SECONDS" "$*" >&2; }
die() { log "FAILED: $*"; exit 1; }
left() { local s=$((DEADLINE - SECONDS)); echo $((s > 1 ? s : 1)); }  # seconds to the deadline

for tool in munged slurmctld slurmd sbatch sacct scancel scontrol sinfo squeue; do
  command -v "$tool" >/dev/null || die "$tool not found: install Debian's slurm-wlm and munge (apt-get install -y slurm-wlm munge)"
done
[ "$(id -u)" = 0 ] || die "run as root: slurmd starts each job as the user who submitted it"
[ -x "$PY" ] || die "$PY not found: run make venv first"

WORK=$(mktemp -d "${SLURM_CHECK_TMP:-${TMPDIR:-/tmp}}/kv-slurm.XXXXXX")
chmod 711 "$WORK"  # munged wants every directory above its socket searchable by all
d=$WORK
while d=$(dirname "$d") && [ "$d" != / ]; do
  case $(stat -c %A "$d") in
    *[xt]) ;;
    *) rmdir "$WORK"; die "munged wants every folder above its socket searchable by all; $d is not (choose another SLURM_CHECK_TMP)";;
  esac
done
# Every Slurm command and daemon reads this file; it is also the mark of our processes (see ours).
export SLURM_CONF=$WORK/slurm.conf
DAEMONS=()

ours() {  # live processes with our SLURM_CONF in their environment: daemons, slurmstepd, job processes
  local e p
  for e in /proc/[0-9]*/environ; do
    p=${e#/proc/}; p=${p%/environ}
    [ "$p" = $$ ] || [ "$p" = "$BASHPID" ] && continue
    grep -qzxF "SLURM_CONF=$SLURM_CONF" "$e" 2>/dev/null && echo "$p"
  done
  return 0
}

stop() {  # stop pid $1 (TERM, then KILL after 10 s); reap it when it is our child
  local pid=$1 i
  kill -TERM "$pid" 2>/dev/null || return 0
  for i in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$? pid left_over
  trap - EXIT INT TERM
  set +e
  if [ -n "${CTLD_PID:-}" ] && kill -0 "$CTLD_PID" 2>/dev/null; then  # cancel what is queued or running
    timeout 10 scancel --user="$(id -un)" 2>/dev/null
    for _ in $(seq 30); do [ -z "$(timeout 3 squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
  fi
  for pid in "${DAEMONS[@]}"; do stop "$pid"; done   # slurmd, slurmctld, munged: the reverse order of start
  for sig in TERM KILL KILL; do  # what is left: jobs whose slurmstepd lost its slurmd, an interrupted make grade
    left_over=$(ours)
    [ -n "$left_over" ] || break
    log "SIG$sig to processes left by the cluster: $(ps -o pid=,comm= -p "${left_over//$'\n'/,}" | tr '\n' ' ')"
    for pid in $left_over; do kill -"$sig" "$pid" 2>/dev/null; done
    sleep 1
    [ "$rc" = 0 ] && rc=1
  done
  if [ "$rc" != 0 ] && [ -d "$WORK/log" ]; then
    for f in "$WORK"/log/*; do log "--- last lines of $f"; tail -n 15 "$f" >&2; done
  fi
  if [ -n "${SLURM_CHECK_KEEP:-}" ]; then log "kept $WORK"; else rm -rf "$WORK"; fi
  log "$([ "$rc" = 0 ] && echo "passed" || echo "FAILED (exit $rc)"); cluster stopped, no daemon left"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# -- the class and its single-machine grades ----------------------------------------------------------
cd "$REPO"
CLASS=$WORK/class
"$PY" scripts/slurm_check.py class "$CLASS" "$SHARDS" >&2
log "grading the class on this machine (make grade WORKERS=2)"
timeout "$(left)" make -s grade SUBMISSIONS="$CLASS" OUT="$WORK/single" WORKERS=2 >"$WORK/single.log" 2>&1 \
  || { tail -n 30 "$WORK/single.log" >&2; die "make grade failed"; }

# -- a one-node cluster in $WORK ----------------------------------------------------------------------
mkdir -p "$WORK"/{state,spool,log,out}
HOST=$(uname -n); HOST=${HOST%%.*}  # the short host name, as slurmctld and slurmd compare it
read -r CTLD_PORT SLURMD_PORT < <("$PY" -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
head -c 1024 /dev/urandom >"$WORK/munge.key"
chmod 600 "$WORK/munge.key"
cat >"$SLURM_CONF" <<EOF
# A throwaway one-node cluster for scripts/slurm_check.sh: every path is inside $WORK.
ClusterName=kvcheck
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$WORK/munge.socket
StateSaveLocation=$WORK/state
SlurmdSpoolDir=$WORK/spool
SlurmctldPidFile=$WORK/slurmctld.pid
SlurmdPidFile=$WORK/slurmd.pid
SlurmctldLogFile=$WORK/log/slurmctld.log
SlurmdLogFile=$WORK/log/slurmd.log
# No cgroups (containers and CI machines often lack them): processes tracked by their parents.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
# sacct needs slurmdbd and a database for job accounting; without them it reads the job completion
# log (sacct --completion), which jobcomp/filetxt writes.
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc=$WORK/jobcomp.txt
MpiDefault=none
SwitchType=switch/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=2 RealMemory=2048 State=UNKNOWN
PartitionName=check Nodes=$HOST Default=YES MaxTime=30 State=UP
EOF

log "starting munged, slurmctld, slurmd (ports $CTLD_PORT, $SLURMD_PORT)"
munged --foreground --socket="$WORK/munge.socket" --key-file="$WORK/munge.key" \
  --pid-file="$WORK/munged.pid" --log-file="$WORK/log/munged.log" --seed-file="$WORK/munged.seed" \
  >>"$WORK/log/munged.out" 2>&1 &
DAEMONS=("$!")
for _ in $(seq 50); do [ -S "$WORK/munge.socket" ] && break; sleep 0.2; done
[ -S "$WORK/munge.socket" ] || die "munged did not start"
slurmctld -D -i >>"$WORK/log/slurmctld.out" 2>&1 &
CTLD_PID=$!
DAEMONS=("$CTLD_PID" "${DAEMONS[@]}")
slurmd -D -N "$HOST" >>"$WORK/log/slurmd.out" 2>&1 &
DAEMONS=("$!" "${DAEMONS[@]}")
for _ in $(seq 100); do
  [ "$(timeout 5 sinfo -h -n "$HOST" -o %t 2>/dev/null)" = idle ] && break
  sleep 0.3
done
[ "$(timeout 5 sinfo -h -n "$HOST" -o %t 2>/dev/null)" = idle ] || die "the node did not come up idle"
log "cluster up: $(sinfo -h -o '%P %D node(s) %c CPUs %t')"

run_array() {  # submit the README's array script and wait for it; $1 = --array spec, $2 = GRADED; sets JOB
  # The #SBATCH resources of the script are overridden here, as an instructor would for a small cluster.
  JOB=$(sbatch --parsable --array="$1" --cpus-per-task=1 --mem=1G --time=10 --output="$WORK/out/%A_%a.out" \
        --export="ALL,SUBMISSIONS=$CLASS,GRADED=$2,SHARDS=$SHARDS" scripts/grade_array.sbatch) || die "sbatch refused the job"
  JOB=${JOB%%;*}
  local st  # poll squeue (sbatch --wait polls at growing intervals, up to half a minute late)
  while :; do
    if st=$(squeue -h -j "$JOB" -t all -o %T 2>/dev/null); then
      [ -z "$st" ] && break
      grep -qvxE 'COMPLETED|FAILED|CANCELLED|TIMEOUT|OUT_OF_MEMORY|NODE_FAIL|BOOT_FAIL|DEADLINE|PREEMPTED' <<<"$st" || break
    fi
    [ "$SECONDS" -lt "$DEADLINE" ] || die "array job $JOB still running at the deadline: $(echo $st)"
    sleep 0.5
  done
}

states() {  # $1 = job id, then TASK=STATE ...: sacct's view of the job's array tasks
  sacct --completion -n -P --format=JobID,State,ExitCode >"$WORK/sacct.txt" 2>/dev/null
  "$PY" scripts/slurm_check.py states "$WORK/jobcomp.txt" "$WORK/sacct.txt" "$@" >&2
}

# -- 1. the array job ---------------------------------------------------------------------------------
log "sbatch --array=1-3 scripts/grade_array.sbatch"
run_array 1-3 "$WORK/graded"
states "$JOB" 1=COMPLETED 2=COMPLETED 3=COMPLETED || { tail -n 20 "$WORK"/out/* >&2; die "the array job failed"; }
"$PY" scripts/slurm_check.py shards "$CLASS" "$WORK/graded" "$SHARDS" >&2 || die "shards"
"$PY" -m autograder merge "$WORK"/graded/shard-* -o "$WORK/graded/grades.csv" 2>"$WORK/merge.log" \
  || { cat "$WORK/merge.log" >&2; die "merge"; }
"$PY" scripts/slurm_check.py same "$WORK/graded/grades.csv" "$WORK/single/grades.csv" >&2 || die "merged != single"
"$PY" -m autograder merge "$WORK"/graded/shard-* -o "$WORK/graded/class" 2>"$WORK/merge.log" \
  || { cat "$WORK/merge.log" >&2; die "merge into a folder"; }
"$PY" scripts/slurm_check.py folders "$WORK/graded/class" "$WORK/single" "$WORK"/graded/shard-* >&2 || die "merged folder != single"

# -- 2. a failing task, then re-running it ------------------------------------------------------------
log "sbatch --array=2 with shard 2's output folder blocked (shards 1 and 3: those of the first job)"
mkdir "$WORK/failed"
cp -a "$WORK/graded/shard-1" "$WORK/graded/shard-3" "$WORK/failed/"
echo "in the way" >"$WORK/failed/shard-2"
run_array 2 "$WORK/failed"
states "$JOB" 2=FAILED || { tail -n 20 "$WORK"/out/* >&2; die "sacct"; }
if "$PY" -m autograder merge "$WORK"/failed/shard-* -o "$WORK/failed/grades.csv" 2>"$WORK/merge.log"; then
  die "merge accepted a failed shard"
fi
[ ! -e "$WORK/failed/grades.csv" ] || die "merge wrote a sheet without shard 2"
"$PY" scripts/slurm_check.py named "$WORK/merge.log" "$CLASS" "$SHARDS" 2 >&2 || die "merge message"
rm "$WORK/failed/shard-2"
log "sbatch --array=2 (the failed task alone)"
run_array 2 "$WORK/failed"
states "$JOB" 2=COMPLETED || { tail -n 20 "$WORK"/out/"${JOB}"_* >&2; die "re-running task 2 failed"; }
"$PY" -m autograder merge "$WORK"/failed/shard-* -o "$WORK/failed/grades.csv" 2>"$WORK/merge.log" \
  || { cat "$WORK/merge.log" >&2; die "merge after the re-run"; }
"$PY" scripts/slurm_check.py same "$WORK/failed/grades.csv" "$WORK/single/grades.csv" >&2 || die "merged != single"
log "all checks passed"
