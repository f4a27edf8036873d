/* shm_seg.h - shared-memory segments for the collectives of ranks on one host (used by
 * comm/zmq_shm.c; see the design there).
 *
 * Each rank owns one segment: an anonymous memfd (nothing in /dev/shm, so nothing to clean
 * up when a process is killed) holding a header page and `nslots` slots of `slot_bytes`,
 * plus an eventfd, its doorbell. A rank hands both descriptors to each peer over a
 * datagram unix socket (SCM_RIGHTS) bound next to its ipc:// endpoint, in the job's
 * private directory; the peer maps the segment and keeps the doorbell to wake the owner.
 *
 * Only the owner writes a slot's data; peers read it. The words below are C11 atomics in
 * shared memory (lock-free on every platform this builds for): a slot's data is published
 * by a store of its stamp, and handed back by decrements of `readers`. */
#ifndef COHORT_COMM_SHM_SEG_H
#define COHORT_COMM_SHM_SEG_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define CM_SHM_MAX_SLOTS 16
#define CM_SHM_HDR_BYTES 4096

typedef struct cm_shm_slot {
    _Atomic uint64_t posted;  /* stamp of the block whose contributions the slot holds */
    _Atomic uint64_t reduced; /* stamp of the block whose reduced piece the slot holds */
    _Atomic uint64_t readers; /* reads of the slot's current content still to come */
    uint64_t count, desc;     /* the poster's call (element count; op and dtype): checked */
    unsigned char pad[24];
} cm_shm_slot;

typedef struct cm_shm_hdr {
    uint32_t magic, rank;
    uint64_t nonce, slot_bytes;
    uint32_t nslots, pad0;
    unsigned char pad1[32];
    _Atomic uint32_t sleeping; /* the owner is (about to be) blocked on its doorbell */
    unsigned char pad2[60];
    cm_shm_slot slot[CM_SHM_MAX_SLOTS];
} cm_shm_hdr;

typedef struct cm_shm_seg {
    unsigned char *base; /* mapping, NULL = none */
    size_t size;
    cm_shm_hdr *hdr;
    int efd; /* the owner's doorbell (write 8 bytes to wake it), -1 = none */
} cm_shm_seg;

/* Creates this rank's segment and doorbell; *memfd_out stays open for cm_shm_send.
 * Returns 0 or -errno. */
int cm_shm_create(cm_shm_seg *s, int *memfd_out, uint32_t rank, uint64_t nonce, size_t slot_bytes,
                  int nslots);
/* Maps a peer's segment from its descriptors and checks its header; memfd is closed in all
 * cases, efd is kept in s on success and closed otherwise. Returns 0 or -errno. */
int cm_shm_attach(cm_shm_seg *s, int memfd, int efd, uint32_t rank, uint64_t nonce,
                  size_t slot_bytes, int nslots);
void cm_shm_release(cm_shm_seg *s);

static inline unsigned char *cm_shm_slot_data(const cm_shm_seg *s, int slot) {
    return s->base + CM_SHM_HDR_BYTES + (size_t)slot * s->hdr->slot_bytes;
}

/* A non-blocking datagram socket bound at path (an old file there is replaced). Returns
 * the descriptor or -errno. */
int cm_shm_sock_bind(const char *path);
/* Sends (memfd, efd) with rank and nonce from sock to the socket at path. 0, -EAGAIN (the
 * peer's queue is full: try again) or -errno. */
int cm_shm_send(int sock, const char *path, int memfd, int efd, uint32_t rank, uint64_t nonce);
/* Receives one such message: 1 (descriptors returned, close-on-exec), 0 (none waiting) or
 * -errno. Malformed messages are dropped (their descriptors closed) and reported as 2. */
int cm_shm_recv(int sock, uint32_t *rank, uint64_t *nonce, int *memfd, int *efd);

#endif
