#!/usr/bin/env bash
# A one-machine Slurm cluster in a scratch folder (munge, slurmctld, slurmd from Debian's
# packages, a generated slurm.conf), and collie launched by it: `srun -n 4 collie run ...`
# for a training and a bench, and scripts/slurm/collie.sbatch through sbatch. Checks each
# job's result and that nothing is left running.
#
#   one_machine_cluster.sh COLLIE_BINARY SOURCE_DIR SCRATCH
#
# Exits 77 (ctest: skipped) without root or without Slurm installed.
set -euo pipefail
collie=$1 source=$2 scratch=$3

for tool in munged mungekey slurmctld slurmd srun sinfo; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed (slurmctld slurmd slurm-client munge)"; exit 77; }
done
[ "$(id -u)" -eq 0 ] || { echo "SKIP: the test cluster's daemons run as root"; exit 77; }

rm -rf "$scratch"
mkdir -p "$scratch"/{state,spool,munge}
chmod 700 "$scratch/munge"
host=$(hostname -s)  # addressed as 127.0.0.1: no name resolution needed
conf=$scratch/slurm.conf
export SLURM_CONF=$conf

stop() {
  for pid_file in "$scratch/slurmd.pid" "$scratch/slurmctld.pid" "$scratch/munge/munged.pid"; do
    [ -f "$pid_file" ] && kill "$(cat "$pid_file")" 2>/dev/null || true
  done
  for _ in $(seq 50); do
    pgrep -f "$scratch/(slurm.conf|munge)" >/dev/null || break
    sleep 0.1
  done
}
fail() {
  echo "FAIL: $*"
  for log in slurmctld.log slurmd.log munge/munged.log; do
    [ -f "$scratch/$log" ] && { echo "--- $log"; tail -20 "$scratch/$log"; }
  done
  stop
  exit 1
}
trap stop EXIT

mungekey --create --keyfile="$scratch/munge/munge.key" --force
chmod 400 "$scratch/munge/munge.key"
munged --key-file="$scratch/munge/munge.key" --socket="$scratch/munge/munge.sock" \
  --pid-file="$scratch/munge/munged.pid" --log-file="$scratch/munge/munged.log" \
  --seed-file="$scratch/munge/munged.seed" --force || fail "munged did not start"

cat >"$conf" <<CONF
ClusterName=collie-test
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
AuthType=auth/munge
AuthInfo=socket=$scratch/munge/munge.sock
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$scratch/state
SlurmdSpoolDir=$scratch/spool
SlurmctldPidFile=$scratch/slurmctld.pid
SlurmdPidFile=$scratch/slurmd.pid
SlurmctldLogFile=$scratch/slurmctld.log
SlurmdLogFile=$scratch/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$host NodeAddr=127.0.0.1 CPUs=4 State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE
CONF

slurmctld -f "$conf" || fail "slurmctld did not start"
slurmd -f "$conf" -N "$host" || fail "slurmd did not start"
for _ in $(seq 100); do
  sinfo -h -o %t 2>/dev/null | grep -qE '^(idle|mix|alloc)' && break
  sleep 0.2
done
sinfo -h -o %t | grep -qE '^(idle|mix|alloc)' || fail "the node never became idle: $(sinfo 2>&1)"

# Training: 4 ranks launched by srun, rank 0 reports.
out=$scratch/train
srun -n 4 --time=5 "$collie" run "$source/configs/quickstart.yaml" --out "$out" \
  --set train.steps=3 --set train.log_every=1 --set train.warmup_steps=1 \
  --set model.params.layers=1 --set model.params.d_model=32 >"$scratch/train.txt" 2>&1 ||
  { cat "$scratch/train.txt"; fail "srun training exited $?"; }
grep -q "weights identical at step 3: .* on all 4 ranks" "$scratch/train.txt" ||
  { cat "$scratch/train.txt"; fail "no weight-sync proof over 4 ranks"; }
[ -s "$out/summary.json" ] || fail "no summary.json"

# A bench over gloo: 4 processes, the same table as collie's own launcher gives.
out=$scratch/bench
srun -n 4 --time=5 "$collie" run "$source/configs/ring-vs-tree.yaml" --out "$out" \
  --set backend=gloo --set bench.max_bytes=64KiB --set bench.iters=2 --set bench.repeats=2 \
  >"$scratch/bench.txt" 2>&1 || { cat "$scratch/bench.txt"; fail "srun bench exited $?"; }
grep -q "collective allreduce on 4 ranks" "$scratch/bench.txt" || { cat "$scratch/bench.txt"; fail "no table"; }
grep -q "Wrong elements: 0 (all results correct)" "$scratch/bench.txt" || fail "wrong elements"
[ -s "$out/results.csv" ] || fail "no results.csv"

# The sbatch script of docs/running.md, on this one node: 4 tasks, a short training.
cd "$source"
sbatch --wait --nodes=1 --ntasks-per-node=4 --cpus-per-task=1 --output="$scratch/sbatch.txt" \
  scripts/slurm/collie.sbatch configs/quickstart.yaml --out "$scratch/sbatch" \
  --set train.steps=3 --set train.warmup_steps=1 --set model.params.layers=1 \
  --set model.params.d_model=32 >/dev/null || { cat "$scratch/sbatch.txt"; fail "sbatch job failed"; }
grep -q "weights identical at step 3: .* on all 4 ranks" "$scratch/sbatch.txt" ||
  { cat "$scratch/sbatch.txt"; fail "the sbatch job trained no 4 ranks"; }

# Nothing of collie is left running (this test's ranks: their --out is in the scratch
# folder; other tests may run collie meanwhile), and the daemons stop.
if pgrep -f -- "--out $scratch/" >/dev/null; then fail "collie processes outlived their jobs"; fi
stop
trap - EXIT
if pgrep -f "$scratch/(slurm.conf|munge)" >/dev/null; then fail "a daemon outlived the test"; fi
echo "PASS: srun and sbatch launched collie for a training and a bench; nothing left running"
