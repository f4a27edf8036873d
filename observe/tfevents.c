/* tfevents.c - the TensorBoard event file writer (see tfevents.h): event serialization
 * through protobuf-c (tbevent.proto), record framing, the queue and its writes. */
#include "observe/tfevents.h"

#include "common/error.h"
#include "common/fsutil.h"
#include "observe/crc32c.h"
#include "observe/tbevent.pb-c.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct ob_tfevents {
    int fd;
    char path[1200];
    uint8_t *q;         /* queued records */
    size_t qlen, qcap;
    int nq, queue_size;
    double flush_secs;
    double oldest;      /* wall time of the oldest queued record */
    off_t size;         /* bytes of whole records in the file */
};

static atomic_int file_counter; /* SummaryWriter's per-process uid */

static double now_wall(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + tv.tv_usec * 1e-6;
}

static void put_le64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_le32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}

size_t ob_tfevents_frame(uint8_t *out, const void *payload, size_t n) {
    put_le64(out, (uint64_t)n);
    put_le32(out + 8, ob_crc32c_mask(ob_crc32c(0, out, 8)));
    memcpy(out + 12, payload, n);
    put_le32(out + 12 + n, ob_crc32c_mask(ob_crc32c(0, payload, n)));
    return n + OB_TFEVENTS_FRAME;
}

/* Appends one event's record to the queue. */
static int queue_event(ob_tfevents *w, const Tensorboard__Event *ev) {
    size_t n = tensorboard__event__get_packed_size(ev);
    if (w->qlen + n + OB_TFEVENTS_FRAME > w->qcap) {
        size_t cap = w->qcap ? w->qcap : 4096;
        while (cap < w->qlen + n + OB_TFEVENTS_FRAME) cap *= 2;
        uint8_t *q = realloc(w->q, cap);
        if (!q) return co_err_set(CO_ENOMEM, "TensorBoard event queue: out of memory (%zu bytes)", cap);
        w->q = q;
        w->qcap = cap;
    }
    uint8_t *rec = w->q + w->qlen;
    tensorboard__event__pack(ev, rec + 12);
    /* frame in place: the payload is already at rec + 12 */
    put_le64(rec, (uint64_t)n);
    put_le32(rec + 8, ob_crc32c_mask(ob_crc32c(0, rec, 8)));
    put_le32(rec + 12 + n, ob_crc32c_mask(ob_crc32c(0, rec + 12, n)));
    if (!w->nq) w->oldest = ev->wall_time;
    w->qlen += n + OB_TFEVENTS_FRAME;
    w->nq++;
    return 0;
}

int ob_tfevents_flush(ob_tfevents *w) {
    if (!w || !w->qlen) return 0;
    size_t done = 0;
    while (done < w->qlen) {
        ssize_t k = write(w->fd, w->q + done, w->qlen - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            int e = k < 0 ? errno : ENOSPC;
            /* records complete or absent: cut a partial write back to the last whole record */
            if (ftruncate(w->fd, w->size) == 0) lseek(w->fd, w->size, SEEK_SET);
            w->qlen = 0;
            w->nq = 0;
            return co_err_set(fs_errno_code(e), "writing TensorBoard events to %s: %s", w->path, strerror(e));
        }
        done += (size_t)k;
    }
    w->size += (off_t)w->qlen;
    w->qlen = 0;
    w->nq = 0;
    return 0;
}

int ob_tfevents_scalar(ob_tfevents *w, const char *tag, int64_t step, float value, double wall_time) {
    Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = value;
    Tensorboard__Summary__Value *vs[1] = {&v};
    Tensorboard__Summary sum = TENSORBOARD__SUMMARY__INIT;
    sum.n_value = 1;
    sum.value = vs;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time;
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &sum;
    int rc = queue_event(w, &ev);
    if (rc) return rc;
    if (w->nq >= w->queue_size || wall_time - w->oldest >= w->flush_secs) return ob_tfevents_flush(w);
    return 0;
}

int ob_tfevents_open(ob_tfevents **out, const char *dir, int queue_size, double flush_secs) {
    *out = NULL;
    if (queue_size < 1) return co_err_set(CO_EINVAL, "TensorBoard queue size %d (must be >= 1)", queue_size);
    int rc = fs_mkdirs(dir);
    if (rc) {
        char why[400];
        snprintf(why, sizeof why, "%s", co_err_detail());
        return co_err_set(rc, "cannot create the TensorBoard directory %s: %s", dir, why);
    }
    ob_tfevents *w = calloc(1, sizeof *w);
    if (!w) return co_err_set(CO_ENOMEM, "TensorBoard writer: out of memory");
    w->queue_size = queue_size;
    w->flush_secs = flush_secs > 0 ? flush_secs : 120;
    double t = now_wall();
    char host[256] = "localhost";
    if (gethostname(host, sizeof host)) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = '\0';
    if (snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s.%d.%d", dir, (long long)t, host,
                 (int)getpid(), atomic_fetch_add(&file_counter, 1)) >= (int)sizeof w->path) {
        free(w);
        return co_err_set(CO_EINVAL, "the TensorBoard directory's path is too long: %s", dir);
    }
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        int e = errno;
        free(w);
        return co_err_set(fs_errno_code(e), "cannot create the TensorBoard event file %s/events.out.tfevents.*: %s",
                          dir, strerror(e));
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = t;
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = "brain.Event:2";
    if ((rc = queue_event(w, &ev)) || (rc = ob_tfevents_flush(w))) {
        close(w->fd);
        unlink(w->path);
        free(w->q);
        free(w);
        return rc;
    }
    fs_fsync_parent(w->path); /* the new file's name survives a crash of the machine */
    *out = w;
    return 0;
}

const char *ob_tfevents_path(const ob_tfevents *w) { return w->path; }

int ob_tfevents_close(ob_tfevents **pw) {
    ob_tfevents *w = *pw;
    if (!w) return 0;
    *pw = NULL;
    int rc = ob_tfevents_flush(w);
    if (fsync(w->fd) && !rc) rc = co_err_set(fs_errno_code(errno), "fsync of %s: %s", w->path, strerror(errno));
    if (close(w->fd) && !rc) rc = co_err_set(fs_errno_code(errno), "closing %s: %s", w->path, strerror(errno));
    free(w->q);
    free(w);
    return rc;
}
