/* tfevents.h - a TensorBoard event file writer (the format of tensorboard's
 * EventFileWriter and PyTorch's SummaryWriter).
 *
 * File: DIR/events.out.tfevents.<%010d unix time>.<hostname>.<pid>.<counter>. Record:
 * u64 LE payload length, u32 masked CRC32C of those 8 bytes, the payload (a serialized
 * tensorboard.Event), u32 masked CRC32C of the payload. The first event carries
 * file_version "brain.Event:2"; each scalar is an Event{wall_time, step, summary{value{tag,
 * simple_value}}} (PyTorch's default old-style scalar).
 *
 * Crash safety: records are queued in memory and written whole, the queue in one write();
 * a write that fails part-way is cut back (ftruncate) to the last whole record, so a job
 * killed at any point leaves a file of complete records (the queued ones are lost). The
 * file is fsync'ed when closed, not per write: training never waits for the disk. */
#ifndef COHORT_OBSERVE_TFEVENTS_H
#define COHORT_OBSERVE_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct ob_tfevents ob_tfevents;

#define OB_TFEVENTS_FRAME 16 /* bytes a record adds to its payload */

/* Creates dir (mkdir -p) and a new event file in it, and writes the file_version event at
 * once. queue_size: scalar events buffered before they are written (>= 1; SummaryWriter's
 * max_queue); flush_secs: also written when the oldest queued event is this old (> 0;
 * SummaryWriter's flush_secs, 120). 0 or a CO_E* code (co_err_detail names the step). */
int ob_tfevents_open(ob_tfevents **out, const char *dir, int queue_size, double flush_secs);
/* The file's path. */
const char *ob_tfevents_path(const ob_tfevents *w);
/* Queues one scalar event (written when the queue is full or old). 0 or a CO_E* code. */
int ob_tfevents_scalar(ob_tfevents *w, const char *tag, int64_t step, float value, double wall_time);
/* Writes the queued records now (one write()). 0 or a CO_E* code. */
int ob_tfevents_flush(ob_tfevents *w);
/* Flushes, fsyncs and closes; *w becomes NULL. 0 or the first error. */
int ob_tfevents_close(ob_tfevents **w);

/* Frames payload as one record into out (n + OB_TFEVENTS_FRAME bytes); returns its size. */
size_t ob_tfevents_frame(uint8_t *out, const void *payload, size_t n);

#endif
