/* The floor for the software switch's CPU per contribution (benchmarks/dataplane_bench.py):
 * what a process that does nothing but receive datagrams and send each one back costs, with the
 * same batched system calls the switch's packet loop uses (recvmmsg/sendmmsg, up to 64 at a
 * time, woken by epoll), for the same datagram size. And the load that drives both.
 *
 *   udp_echo echo IP PORT
 *       receive on IP:PORT; send every datagram back to its sender. Runs until killed.
 *   udp_echo load TARGET_IP TARGET_PORT WINDOW ROUNDS K WORKER_IP:PORT...
 *       each worker (a UDP socket at its address) sends one inagg contribution of K values for
 *       each of WINDOW slots (job 1, epoch 1, rank = its position, set = round % 2), then every
 *       worker waits for WINDOW datagrams back; ROUNDS times. The contributions are valid for a
 *       switch job of those workers over slots [0, WINDOW), and an echo returns each one as its
 *       result would come. Prints "sent S received R" (R < S: datagrams lost, 2 s timeout).
 *
 * Build: cc -O2 -o udp_echo udp_echo.c (the benchmark script does it).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define BATCH 64
#define MAX_DATAGRAM 65536
#define MAX_WORKERS 32
#define HEADER_BYTES 16

static void die(const char *what) {
    perror(what);
    exit(1);
}

static int udp_socket(const char *ip, int port) {
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) die("socket");
    int size = 32 << 20;
    if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &size, sizeof size) != 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, sizeof size);
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &size, sizeof size) != 0)
        setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, sizeof size);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, ip, &a.sin_addr) != 1) {
        fprintf(stderr, "bad IPv4 address %s\n", ip);
        exit(2);
    }
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0) die("bind");
    return fd;
}

/* recvmmsg a batch without blocking, send it all back with sendmmsg; epoll between batches. */
__attribute__((noreturn)) static void echo(const char *ip, int port) {
    int fd = udp_socket(ip, port);
    static uint8_t bufs[BATCH][MAX_DATAGRAM];
    struct iovec iov[BATCH];
    struct sockaddr_in from[BATCH];
    struct mmsghdr msgs[BATCH];
    int ep = epoll_create1(0);
    struct epoll_event ev = {.events = EPOLLIN}, got;
    if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev) != 0) die("epoll");
    for (;;) {
        if (epoll_wait(ep, &got, 1, -1) < 0 && errno != EINTR) die("epoll_wait");
        memset(msgs, 0, sizeof msgs);
        for (int i = 0; i < BATCH; i++) {
            iov[i] = (struct iovec){bufs[i], MAX_DATAGRAM};
            msgs[i].msg_hdr = (struct msghdr){.msg_name = &from[i], .msg_namelen = sizeof from[i],
                                              .msg_iov = &iov[i], .msg_iovlen = 1};
        }
        int n = recvmmsg(fd, msgs, BATCH, MSG_DONTWAIT, NULL);
        if (n <= 0) continue;
        for (int i = 0; i < n; i++) iov[i].iov_len = msgs[i].msg_len;
        for (int done = 0; done < n;) {
            int sent = sendmmsg(fd, msgs + done, n - done, 0);
            if (sent < 0 && errno != EINTR) die("sendmmsg");
            if (sent > 0) done += sent;
        }
    }
}

static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = (uint8_t)v; }
static void put32(uint8_t *p, uint32_t v) { put16(p, v >> 16); put16(p + 2, (uint16_t)v); }

/* A slot's rounds before its set and round tag repeat (inagg.hostlib.wire.protocol.ROUND_CYCLE). */
#define ROUND_CYCLE 16

/* An inagg contribution (inagg.hostlib.wire.protocol.build_contribution): K values, all `value`,
 * of the slot's round `round` (mod ROUND_CYCLE): set round % 2, round tag round / 2 in flags. */
static size_t contribution(uint8_t *p, int rank, int slot, int round, int k, int32_t value) {
    int set = round & 1;
    memset(p, 0, HEADER_BYTES);
    p[0] = 0x11;                        /* version 1, MSG_CONTRIBUTION */
    p[1] = (uint8_t)((round >> 1 & 7) << 4);  /* the round tag (ROUND_TAG_MASK) */
    put16(p + 2, 1);                    /* job */
    p[4] = (uint8_t)rank;
    p[5] = 0x80;                        /* EXP_NONE */
    put16(p + 6, 1);                    /* epoch */
    put16(p + 8, (uint16_t)(set << 15 | slot));
    put16(p + 10, (uint16_t)k);         /* count */
    put32(p + 12, (uint32_t)(slot * k));
    for (int i = 0; i < k; i++) put32(p + HEADER_BYTES + 4 * i, (uint32_t)value);
    return HEADER_BYTES + 4 * (size_t)k;
}

static long receive(int fd, int want, uint8_t *buf) {
    struct iovec iov[BATCH];
    struct mmsghdr msgs[BATCH];
    long got = 0;
    while (got < want) {
        int n = want - got < BATCH ? want - got : BATCH;
        memset(msgs, 0, sizeof msgs);
        for (int i = 0; i < n; i++) {
            iov[i] = (struct iovec){buf, MAX_DATAGRAM};
            msgs[i].msg_hdr = (struct msghdr){.msg_iov = &iov[i], .msg_iovlen = 1};
        }
        int r = recvmmsg(fd, msgs, n, MSG_WAITFORONE, NULL);
        if (r < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) return got; /* timed out: lost */
            die("recvmmsg");
        }
        got += r;
    }
    return got;
}

static int load(int argc, char **argv) {
    if (argc < 8) {
        fprintf(stderr, "usage: udp_echo load TARGET_IP TARGET_PORT WINDOW ROUNDS K WORKER_IP:PORT...\n");
        return 2;
    }
    const char *target_ip = argv[2];
    int target_port = atoi(argv[3]), window = atoi(argv[4]), rounds = atoi(argv[5]), k = atoi(argv[6]);
    int n = argc - 7;
    if (n > MAX_WORKERS || window < 1 || window > 32768 || k < 1 || k > 16000) {
        fprintf(stderr, "udp_echo load: bad window, K or worker count\n");
        return 2;
    }
    struct sockaddr_in to = {.sin_family = AF_INET, .sin_port = htons(target_port)};
    inet_pton(AF_INET, target_ip, &to.sin_addr);
    int fds[MAX_WORKERS];
    struct timeval timeout = {.tv_sec = 2};
    for (int r = 0; r < n; r++) {
        char ip[64];
        int port;
        if (sscanf(argv[7 + r], "%63[^:]:%d", ip, &port) != 2) {
            fprintf(stderr, "bad worker %s: expected IP:PORT\n", argv[7 + r]);
            return 2;
        }
        fds[r] = udp_socket(ip, port);
        setsockopt(fds[r], SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    }
    size_t bytes = HEADER_BYTES + 4 * (size_t)k;
    uint8_t *packets = malloc(ROUND_CYCLE * (size_t)n * window * bytes); /* [round][rank][slot] */
    uint8_t *rx = malloc(MAX_DATAGRAM);
    struct mmsghdr *msgs = calloc(window, sizeof *msgs);
    struct iovec *iov = calloc(window, sizeof *iov);
    if (!packets || !rx || !msgs || !iov) die("malloc");
    for (int c = 0; c < ROUND_CYCLE; c++)
        for (int r = 0; r < n; r++)
            for (int s = 0; s < window; s++)
                contribution(packets + (((size_t)c * n + r) * window + s) * bytes, r, s, c, k, r + s);
    long sent = 0, received = 0;
    for (int round = 0; round < rounds; round++) {
        for (int r = 0; r < n; r++) {
            for (int s = 0; s < window; s++) {
                iov[s] = (struct iovec){packets + (((size_t)(round % ROUND_CYCLE) * n + r) * window + s) * bytes, bytes};
                msgs[s].msg_hdr = (struct msghdr){.msg_name = &to, .msg_namelen = sizeof to,
                                                  .msg_iov = &iov[s], .msg_iovlen = 1};
            }
            for (int done = 0; done < window;) {
                int k_sent = sendmmsg(fds[r], msgs + done, window - done, 0);
                if (k_sent < 0 && errno != EINTR) die("sendmmsg");
                if (k_sent > 0) done += k_sent;
            }
            sent += window;
        }
        for (int r = 0; r < n; r++) received += receive(fds[r], window, rx);
    }
    printf("sent %ld received %ld\n", sent, received);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "echo") == 0) echo(argv[2], atoi(argv[3]));
    if (argc >= 2 && strcmp(argv[1], "load") == 0) return load(argc, argv);
    fprintf(stderr, "usage: udp_echo echo IP PORT | udp_echo load TARGET_IP TARGET_PORT WINDOW "
                    "ROUNDS K WORKER_IP:PORT...\n");
    return 2;
}
