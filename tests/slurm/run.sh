#!/usr/bin/env bash
# A real SLURM: bring up a one-node cluster on localhost (munged, slurmctld, slurmd, a fake
# GPU gres), run the smoke pipeline through workflow/profiles/slurm, check that its jobs went
# through sbatch, compare its outputs with a local run of the same targets, stop the daemons.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/../.." && pwd)
PATH="$REPO/.venv/bin:$PATH"
WORK=$(mktemp -d /tmp/moecache-slurm.XXXXXX)
STATE="$WORK/state"
TARGETS=(results/runs/a/lru-x1.json results/runs/a/farthest-future-x1.json
         results/runs/a/dwell-4-x1.json)
REHEARSAL_TARGETS=(results/runs/a/lru-x1.json results/runs/a/lru-x10.json)

if ! command -v slurmctld >/dev/null || ! command -v munged >/dev/null; then
    echo "slurm test: installing Debian's slurm-wlm and munge"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
fi

started=()
stop() {
    scontrol shutdown >/dev/null 2>&1 || true
    for pid in "${started[@]}"; do kill "$pid" 2>/dev/null || true; done
}
trap stop EXIT

mkdir -p "$STATE"/{spool,ctld,log} /run/munge /etc/slurm
chown munge:munge /run/munge
[ -s /etc/munge/munge.key ] || mungekey --create
if [ ! -S /run/munge/munge.socket.2 ]; then
    su -s /bin/sh munge -c "munged --force"
    for _ in $(seq 30); do [ -s /run/munge/munged.pid ] && break; sleep 1; done
    started+=("$(cat /run/munge/munged.pid)")
fi
mem=$(($(awk '/MemTotal/ {print $2}' /proc/meminfo) / 1024 - 2048))
cat > /etc/slurm/slurm.conf <<CONF
ClusterName=moecache-ci
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
MpiDefault=none
StateSaveLocation=$STATE/ctld
SlurmdSpoolDir=$STATE/spool
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/log/slurmctld.log
SlurmdLogFile=$STATE/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
ReturnToService=2
MinJobAge=3600
GresTypes=gpu
NodeName=localhost CPUs=$(nproc) RealMemory=$mem Gres=gpu:1 State=UNKNOWN
PartitionName=cpu Nodes=localhost Default=YES MaxTime=INFINITE State=UP
PartitionName=gpu Nodes=localhost MaxTime=INFINITE State=UP
CONF
# No GPU here: one count-only gres stands in, so GPU rules can be scheduled.
printf 'AutoDetect=off\nNodeName=localhost Name=gpu File=/dev/null Count=1\n' \
    > /etc/slurm/gres.conf
# In the foreground (-D) and backgrounded here, so their pids are known at once: a daemonised
# slurmd writes its pid file a moment later, and a loaded machine lost that race.
slurmctld -D >"$STATE/log/slurmctld.out" 2>&1 &
started+=("$!")
slurmd -D >"$STATE/log/slurmd.out" 2>&1 &
started+=("$!")
for _ in $(seq 60); do sinfo -h -o %T 2>/dev/null | grep -qx idle && break; sleep 1; done
sinfo -h -o %T | grep -qx idle || {
    echo "slurm test: node did not come up"; tail "$STATE"/log/*; exit 1
}
echo "slurm test: one-node cluster up ($(sinfo -V))"

smoke=(-s "$REPO/Snakefile" "${TARGETS[@]}" --configfile "$REPO/config/smoke.yaml")
echo "slurm test: local run"
snakemake --directory "$WORK/local" "${smoke[@]}" --cores 1 --resources gpu=1 --quiet
echo "slurm test: the same targets through workflow/profiles/slurm"
# The profile as a user has it, with this node's sizes: no accounting database here, so no
# account (job status comes from squeue, as the profile sets); GPU rules on the gpu partition
# with the memory this machine has.
gpu_rules=(gates decode)
slurm_options=(--workflow-profile "$REPO/workflow/profiles/slurm"
    --default-resources slurm_partition=cpu runtime=30 mem_mb=4000
    --set-resources $(for r in "${gpu_rules[@]}"; do
        printf '%s:slurm_partition=gpu %s:mem_mb=4000 ' "$r" "$r"; done)
    --slurm-init-seconds-before-status-checks 2 --slurm-keep-successful-logs --quiet)
snakemake --directory "$WORK/slurm" "${smoke[@]}" "${slurm_options[@]}"

python "$REPO/tests/slurm/compare.py" "$WORK/local" "$WORK/slurm" "${TARGETS[@]}"

# The paper's pretrained path, rehearsed: config/rehearsal.yaml on a tiny OLMoE checkpoint in
# the hub's layout and a local text file (no tokenizer or training jobs).
rehearsal=(-s "$REPO/Snakefile" "${REHEARSAL_TARGETS[@]}" --configfile "$REPO/config/rehearsal.yaml")
for side in local-rehearsal slurm-rehearsal; do
    mkdir -p "$WORK/$side" && (cd "$WORK/$side" && python "$REPO/tests/rehearsal/build.py" rehearsal)
done
echo "slurm test: rehearsal config, local run"
snakemake --directory "$WORK/local-rehearsal" "${rehearsal[@]}" --cores 1 --resources gpu=1 --quiet
echo "slurm test: rehearsal config through workflow/profiles/slurm"
snakemake --directory "$WORK/slurm-rehearsal" "${rehearsal[@]}" "${slurm_options[@]}"
python "$REPO/tests/slurm/compare.py" --pretrained "$WORK/local-rehearsal" \
    "$WORK/slurm-rehearsal" "${REHEARSAL_TARGETS[@]}"
echo "slurm test: passed"
rm -rf "$WORK"
