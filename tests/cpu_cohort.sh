#!/bin/sh
# cpu_cohort.sh - the `cohort` of the CPU test suites (tests/integration, tests/fault): runs
# $COHORT_CPU_EXE with `--device cpu` right after `train`, so that on a machine with a GPU
# they train on the CPU as they are meant to (the default --device auto would take the
# GPU); other subcommands pass through unchanged. exec keeps the process id, so a script's
# $! is the trainer itself.
if [ "${1:-}" = train ]; then
    shift
    exec "${COHORT_CPU_EXE:?}" train --device cpu "$@"
fi
exec "${COHORT_CPU_EXE:?}" "$@"
