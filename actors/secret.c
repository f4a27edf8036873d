/* secret.c - the job secret file (CURVE keypairs from `cohort keygen`: written 0600
 * crash-safely, refused when others can read it) and private directories for ipc endpoints. */
#include "actors/internal.h"

#include "common/error.h"
#include "common/fsutil.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

int ac_secret_generate(ac_secret *s) {
    if (!s) return co_err_set(CO_EINVAL, "ac_secret_generate: no output");
    memset(s, 0, sizeof *s);
    if (!zmq_has("curve")) return co_err_set(CO_EUNSUPPORTED, "libzmq was built without CURVE");
    if (zmq_curve_keypair(s->server_public, s->server_secret) != 0 ||
        zmq_curve_keypair(s->client_public, s->client_secret) != 0)
        return co_err_set(CO_EINTERNAL, "zmq_curve_keypair: %s", zmq_strerror(zmq_errno()));
    return 0;
}

static const char *const k_names[4] = {"server_public", "server_secret", "client_public",
                                       "client_secret"};

static char *field(ac_secret *s, int i) {
    char *f[4] = {s->server_public, s->server_secret, s->client_public, s->client_secret};
    return f[i];
}

int ac_secret_write(const char *path, const ac_secret *s) {
    if (!path || !s) return co_err_set(CO_EINVAL, "ac_secret_write: no path or secret");
    ac_secret c = *s;
    char text[512];
    int n = snprintf(text, sizeof text,
                     "# cohort job secret: CURVE keys for the control and data planes. Keep it private "
                     "(mode 0600).\n");
    for (int i = 0; i < 4; i++) {
        if (strlen(field(&c, i)) != AC_KEY_Z85_LEN)
            return co_err_set(CO_EINVAL, "ac_secret_write: %s is not a Z85 key", k_names[i]);
        n += snprintf(text + n, sizeof text - (size_t)n, "%s=%s\n", k_names[i], field(&c, i));
    }
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid()) >= (int)sizeof tmp)
        return co_err_set(CO_EINVAL, "%s: path too long", path);
    unlink(tmp); /* a leftover from a crash (O_EXCL below refuses links) */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "%s: cannot create: %s", tmp, strerror(e));
    }
    int rc = 0;
    if (fchmod(fd, 0600) != 0 || write(fd, text, (size_t)n) != n || fsync(fd) != 0) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "%s: cannot write: %s", tmp, strerror(e));
    }
    if (close(fd) != 0 && !rc) rc = co_err_set(CO_EIO, "%s: close failed", tmp);
    if (!rc && rename(tmp, path) != 0) {
        int e = errno;
        rc = co_err_set(fs_errno_code(e), "%s: cannot rename: %s", path, strerror(e));
    }
    if (rc) {
        unlink(tmp);
        return rc;
    }
    return fs_fsync_parent(path);
}

int ac_secret_load(const char *path, ac_secret *s) {
    if (!path || !s) return co_err_set(CO_EINVAL, "ac_secret_load: no path or secret");
    memset(s, 0, sizeof *s);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) {
        int e = errno;
        return co_err_set(e == ELOOP ? CO_EDENIED : fs_errno_code(e), "%s: cannot open: %s", path,
                          strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        close(fd);
        return co_err_set(CO_EIO, "%s: cannot stat", path);
    }
    if (!S_ISREG(st.st_mode) || (st.st_mode & 077) || st.st_uid != geteuid()) {
        close(fd);
        return co_err_set(CO_EDENIED,
                          "%s: the job secret must be a regular file owned by this user with "
                          "mode 0600 (it is %04o); run chmod 600",
                          path, (unsigned)(st.st_mode & 07777));
    }
    char text[1024];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n < 0) return co_err_set(CO_EIO, "%s: cannot read", path);
    text[n] = 0;
    int seen = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        if (line[0] == '#' || line[0] == 0) continue;
        char *eq = strchr(line, '=');
        if (!eq) return co_err_set(CO_EFORMAT, "%s: malformed line", path);
        *eq = 0;
        int i = 0;
        while (i < 4 && strcmp(line, k_names[i])) i++;
        uint8_t bin[32];
        if (i == 4 || strlen(eq + 1) != AC_KEY_Z85_LEN || !zmq_z85_decode(bin, eq + 1))
            return co_err_set(CO_EFORMAT, "%s: bad entry '%s'", path, line);
        memcpy(field(s, i), eq + 1, AC_KEY_Z85_LEN + 1);
        seen |= 1 << i;
    }
    if (seen != 15) {
        memset(s, 0, sizeof *s);
        return co_err_set(CO_EFORMAT, "%s: missing keys (need %s, %s, %s, %s)", path,
                          k_names[0], k_names[1], k_names[2], k_names[3]);
    }
    return 0;
}

/* ---- ipc directories ----------------------------------------------------------------- */

int ac_ipc_dir_create(char *dir, size_t cap) {
    if (!dir || !cap) return co_err_set(CO_EINVAL, "ac_ipc_dir_create: no buffer");
    const char *xdg = getenv("XDG_RUNTIME_DIR");
    struct stat st;
    int n;
    if (xdg && *xdg && stat(xdg, &st) == 0 && S_ISDIR(st.st_mode) && st.st_uid == geteuid() &&
        access(xdg, W_OK) == 0)
        n = snprintf(dir, cap, "%s/cohort-XXXXXX", xdg);
    else
        n = snprintf(dir, cap, "/tmp/cohort-%u-XXXXXX", (unsigned)geteuid());
    if (n < 0 || (size_t)n >= cap) return co_err_set(CO_ERANGE, "ipc directory path too long");
    if (!mkdtemp(dir)) { /* mkdtemp creates it 0700 */
        int e = errno;
        return co_err_set(fs_errno_code(e), "%s: mkdtemp: %s", dir, strerror(e));
    }
    if (chmod(dir, 0700) != 0) {
        int e = errno;
        rmdir(dir);
        return co_err_set(fs_errno_code(e), "%s: chmod: %s", dir, strerror(e));
    }
    return 0;
}

int ac_ipc_endpoint(const char *dir, const char *name, char *out, size_t cap) {
    if (!dir || !name || !out) return co_err_set(CO_EINVAL, "ac_ipc_endpoint: missing argument");
    struct sockaddr_un un;
    int n = snprintf(out, cap, "ipc://%s/%s", dir, name);
    if (n < 0 || (size_t)n >= cap || (size_t)n - 6 >= sizeof un.sun_path)
        return co_err_set(CO_ERANGE, "ipc endpoint %s/%s: path too long (limit %zu)", dir, name,
                          sizeof un.sun_path - 1);
    return 0;
}

int ac_ipc_dir_remove(const char *dir) {
    if (!dir) return 0;
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4096];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            if (snprintf(p, sizeof p, "%s/%s", dir, e->d_name) < (int)sizeof p) unlink(p);
        }
        closedir(d);
    }
    if (rmdir(dir) != 0 && errno != ENOENT) {
        int e = errno;
        return co_err_set(fs_errno_code(e), "%s: rmdir: %s", dir, strerror(e));
    }
    return 0;
}
