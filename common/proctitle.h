/* proctitle.h - what `ps` and `top` show for a cohort process: its 15-character name (the
 * comm, prctl PR_SET_NAME: "cohort-r3", "cohort-sv", "cohort-agent1") and its command line
 * (the argv area, /proc/PID/cmdline: "cohort: rank 3 of job ... (node 1)"). Workers are
 * started through /proc/self/exe, so without it every one shows as `exe`. */
#ifndef COHORT_COMMON_PROCTITLE_H
#define COHORT_COMMON_PROCTITLE_H

#include <stdint.h>

/* Called once by main, first: copies the argv strings (argv[i] then points at the copies,
 * which stay valid for the process's life) and the environment (environ becomes a copy), so
 * that the memory they occupied can take a title. Without it (or when memory runs out), a
 * title changes only the comm. */
void co_proctitle_init(int argc, char **argv);

/* Names this process: comm (truncated to 15 characters) for the calling thread and every
 * thread that still has the process's old name; title (truncated to the room argv and the
 * environment had) as its command line. */
void co_proctitle_set(const char *comm, const char *title);

typedef enum { CO_PROC_SUPERVISOR, CO_PROC_AGENT, CO_PROC_WORKER } co_proc_role;

/* The names of a job's processes: the supervisor ("cohort-sv", "cohort: supervisor of job
 * ID"), a node agent ("cohort-agentN", "cohort: node agent N of job ID") and a worker
 * ("cohort-rR", "cohort: rank R of job ID (node N)"); rank is a worker's, node the node's
 * rank; job_id in hex. */
void co_proctitle_role(co_proc_role role, int rank, int node, uint64_t job_id);

/* When process pid (0: this one) started, in clock ticks after boot (/proc/PID/stat's
 * starttime): with the pid, what names one process across pid reuse. 0 where unknown. */
uint64_t co_proc_start_ticks(int pid);

#endif
