/* intruder.c - a process without the job's secret attacking a job's data plane (the test
 * dp_keyless_peer): for SECONDS it connects to every PORT on HOST again and again, as a
 * plain ZeroMQ DEALER claiming each rank's routing id ('R' + rank) and sending messages
 * shaped like the data plane's (the right magic, junk after it); as a CURVE client with a
 * key of its own; and as raw tcp writing random bytes. It prints what it tried.
 *   intruder HOST SECONDS RANKS PORT...   (exit 0 unless it could not run at all) */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void junk(void *p, size_t n) {
    if (getrandom(p, n, 0) != (ssize_t)n) memset(p, 0x5a, n);
}

/* a frame that starts like the data plane's header: magic "CMZ1", then random bytes */
static void send_fake(void *s) {
    unsigned char hdr[40], body[256];
    junk(hdr, sizeof hdr);
    junk(body, sizeof body);
    uint32_t magic = 0x315A4D43u;
    memcpy(hdr, &magic, 4);
    zmq_send(s, hdr, sizeof hdr, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(s, body, sizeof body, ZMQ_DONTWAIT);
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: intruder HOST SECONDS RANKS PORT...\n");
        return 2;
    }
    const char *host = argv[1];
    double secs = atof(argv[2]), end = now() + secs;
    int ranks = atoi(argv[3]);
    void *ctx = zmq_ctx_new();
    long plain = 0, curve = 0, raw = 0;
    while (now() < end) {
        for (int a = 4; a < argc; a++) {
            int port = atoi(argv[a]);
            char ep[128];
            snprintf(ep, sizeof ep, "tcp://%s:%d", host, port);
            int zero = 0;
            /* plain ZeroMQ, each rank's routing id in turn */
            for (int r = 0; r < ranks; r++) {
                void *d = zmq_socket(ctx, ZMQ_DEALER);
                unsigned char id[5] = {'R', (unsigned char)r, 0, 0, 0};
                zmq_setsockopt(d, ZMQ_ROUTING_ID, id, sizeof id);
                zmq_setsockopt(d, ZMQ_LINGER, &zero, sizeof zero);
                zmq_connect(d, ep);
                for (int i = 0; i < 20; i++) send_fake(d);
                plain++;
                usleep(5000);
                zmq_close(d);
            }
            /* CURVE with a key that is not the job's (and a guessed server key) */
            char pub[41], sec[41], spub[41], ssec[41];
            zmq_curve_keypair(pub, sec);
            zmq_curve_keypair(spub, ssec);
            void *c = zmq_socket(ctx, ZMQ_DEALER);
            zmq_setsockopt(c, ZMQ_LINGER, &zero, sizeof zero);
            zmq_setsockopt(c, ZMQ_CURVE_SERVERKEY, spub, 40);
            zmq_setsockopt(c, ZMQ_CURVE_PUBLICKEY, pub, 40);
            zmq_setsockopt(c, ZMQ_CURVE_SECRETKEY, sec, 40);
            zmq_connect(c, ep);
            for (int i = 0; i < 20; i++) send_fake(c);
            curve++;
            usleep(5000);
            zmq_close(c);
            /* raw bytes: a ZeroMQ greeting's start, then junk */
            int fd = socket(AF_INET, SOCK_STREAM, 0);
            struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
            inet_pton(AF_INET, host, &sa.sin_addr);
            if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0) {
                unsigned char b[4096];
                junk(b, sizeof b);
                b[0] = 0xff;
                b[9] = 0x7f;
                ssize_t w = write(fd, b, sizeof b);
                (void)w;
                raw++;
            }
            if (fd >= 0) close(fd);
        }
    }
    zmq_ctx_term(ctx);
    printf("intruder: %ld plain connections claiming ranks, %ld CURVE with a foreign key, %ld raw\n", plain,
           curve, raw);
    return 0;
}
