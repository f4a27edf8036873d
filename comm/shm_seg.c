/* shm_seg.c - shared-memory segments and descriptor passing (see shm_seg.h). */
#include "comm/shm_seg.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CM_SHM_MAGIC 0x4D48534Du  /* "MSHM" */
#define CM_SHM_MSG_MAGIC 0x31444643u /* "CFD1" */

_Static_assert(sizeof(cm_shm_hdr) <= CM_SHM_HDR_BYTES, "segment header fits its page");
_Static_assert(sizeof(cm_shm_slot) == 64, "one slot header per cache line");
_Static_assert(ATOMIC_LLONG_LOCK_FREE == 2 && ATOMIC_INT_LOCK_FREE == 2,
               "atomics in shared memory must be lock-free");

static size_t seg_size(size_t slot_bytes, int nslots) {
    return CM_SHM_HDR_BYTES + slot_bytes * (size_t)nslots;
}

int cm_shm_create(cm_shm_seg *s, int *memfd_out, uint32_t rank, uint64_t nonce, size_t slot_bytes,
                  int nslots) {
    memset(s, 0, sizeof *s);
    s->efd = -1;
    *memfd_out = -1;
    if (nslots < 1 || nslots > CM_SHM_MAX_SLOTS || slot_bytes == 0 || slot_bytes % 64) return -EINVAL;
    size_t size = seg_size(slot_bytes, nslots);
    int fd = memfd_create("cohort-comm", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return -errno;
    int e = 0;
    if (ftruncate(fd, (off_t)size) != 0) e = errno;
    /* peers can then never shrink it under a mapping (SIGBUS) */
    if (!e && fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) e = errno;
    void *p = MAP_FAILED;
    if (!e) {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
        if (p == MAP_FAILED) e = errno;
    }
    int efd = e ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (!e && efd < 0) e = errno;
    if (e) {
        if (p != MAP_FAILED) munmap(p, size);
        close(fd);
        return -e;
    }
    s->base = p;
    s->size = size;
    s->hdr = p;
    s->efd = efd;
    s->hdr->magic = CM_SHM_MAGIC;
    s->hdr->rank = rank;
    s->hdr->nonce = nonce;
    s->hdr->slot_bytes = slot_bytes;
    s->hdr->nslots = (uint32_t)nslots;
    *memfd_out = fd;
    return 0;
}

int cm_shm_attach(cm_shm_seg *s, int memfd, int efd, uint32_t rank, uint64_t nonce,
                  size_t slot_bytes, int nslots) {
    memset(s, 0, sizeof *s);
    s->efd = -1;
    size_t size = seg_size(slot_bytes, nslots);
    struct stat st;
    int e = 0;
    if (fstat(memfd, &st) != 0) e = errno;
    else if ((size_t)st.st_size != size || (fcntl(memfd, F_GET_SEALS) & F_SEAL_SHRINK) == 0)
        e = EPROTO;
    void *p = MAP_FAILED;
    if (!e) {
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, memfd, 0);
        if (p == MAP_FAILED) e = errno;
    }
    close(memfd);
    if (!e) {
        const cm_shm_hdr *h = p;
        if (h->magic != CM_SHM_MAGIC || h->rank != rank || h->nonce != nonce ||
            h->slot_bytes != slot_bytes || h->nslots != (uint32_t)nslots)
            e = EPROTO;
    }
    if (e) {
        if (p != MAP_FAILED) munmap(p, size);
        close(efd);
        return -e;
    }
    s->base = p;
    s->size = size;
    s->hdr = p;
    s->efd = efd;
    return 0;
}

void cm_shm_release(cm_shm_seg *s) {
    if (s->base) munmap(s->base, s->size);
    if (s->efd >= 0) close(s->efd);
    memset(s, 0, sizeof *s);
    s->efd = -1;
}

static int addr_of(const char *path, struct sockaddr_un *a) {
    memset(a, 0, sizeof *a);
    a->sun_family = AF_UNIX;
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof a->sun_path) return -ENAMETOOLONG;
    memcpy(a->sun_path, path, n);
    return 0;
}

int cm_shm_sock_bind(const char *path) {
    struct sockaddr_un a;
    int rc = addr_of(path, &a);
    if (rc) return rc;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return -errno;
    unlink(path);
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

int cm_shm_send(int sock, const char *path, int memfd, int efd, uint32_t rank, uint64_t nonce) {
    struct sockaddr_un a;
    int rc = addr_of(path, &a);
    if (rc) return rc;
    uint32_t body[4] = {CM_SHM_MSG_MAGIC, rank, (uint32_t)nonce, (uint32_t)(nonce >> 32)};
    struct iovec iov = {body, sizeof body};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(2 * sizeof(int))];
    } cb;
    memset(&cb, 0, sizeof cb);
    struct msghdr m = {.msg_name = &a, .msg_namelen = sizeof a, .msg_iov = &iov, .msg_iovlen = 1,
                       .msg_control = cb.b, .msg_controllen = sizeof cb.b};
    struct cmsghdr *c = CMSG_FIRSTHDR(&m);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(2 * sizeof(int));
    int fds[2] = {memfd, efd};
    memcpy(CMSG_DATA(c), fds, sizeof fds);
    for (;;) {
        if (sendmsg(sock, &m, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)sizeof body) return 0;
        if (errno == EINTR) continue;
        return errno == EWOULDBLOCK ? -EAGAIN : -errno;
    }
}

int cm_shm_recv(int sock, uint32_t *rank, uint64_t *nonce, int *memfd, int *efd) {
    uint32_t body[4] = {0};
    struct iovec iov = {body, sizeof body};
    union {
        struct cmsghdr h;
        char b[CMSG_SPACE(4 * sizeof(int))];
    } cb;
    struct msghdr m = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cb.b,
                       .msg_controllen = sizeof cb.b};
    ssize_t n;
    do n = recvmsg(sock, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    while (n < 0 && errno == EINTR);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
    int fds[4], nfd = 0;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k && nfd < 4; i++) memcpy(&fds[nfd++], CMSG_DATA(c) + i * sizeof(int), sizeof(int));
    }
    if (n != (ssize_t)sizeof body || body[0] != CM_SHM_MSG_MAGIC || nfd != 2 ||
        (m.msg_flags & (MSG_CTRUNC | MSG_TRUNC))) {
        for (int i = 0; i < nfd; i++) close(fds[i]);
        return 2;
    }
    *rank = body[1];
    *nonce = (uint64_t)body[2] | (uint64_t)body[3] << 32;
    *memfd = fds[0];
    *efd = fds[1];
    return 1;
}
