#!/bin/sh
# entrypoint.sh - the container command of deploy/k8s/cohort.yaml's Indexed Job: one pod per
# node runs `cohort train`, which takes its node rank from JOB_COMPLETION_INDEX and --nnodes,
# --master-addr, --master-port, --nproc-per-node from NNODES, MASTER_ADDR, MASTER_PORT,
# NPROC_PER_NODE (flags given as arguments win). docs/deploy.md, "Kubernetes".
#   COHORT_CKPT_DIR    (required) checkpoint directory on the PersistentVolumeClaim: --save and
#                      --load (a new pod after a preemption resumes from its latest checkpoint)
#   COHORT_JOB_SECRET  (required) the job's key file (`cohort keygen`), from a Secret
#   POD_IP             this pod's address for the other nodes (--node-addr), downward API
#   COHORT             the cohort binary (default: cohort on PATH)
# exec: cohort is the container's PID 1, so Kubernetes' SIGTERM reaches it (it stops after
# the step, saves, exits 75 through --requeue-on-sigterm; the Job starts the pod anew).
set -eu
ckpt=${COHORT_CKPT_DIR:?entrypoint.sh: COHORT_CKPT_DIR (the checkpoint directory) is not set}
secret=${COHORT_JOB_SECRET:?entrypoint.sh: COHORT_JOB_SECRET (the job key file) is not set}
set -- --save "$ckpt" --load "$ckpt" --job-secret "$secret" --requeue-on-sigterm "$@"
if [ -n "${POD_IP:-}" ]; then set -- --node-addr "$POD_IP" "$@"; fi
exec "${COHORT:-cohort}" train "$@"
