/* sd_notify.c — the systemd notify protocol without libsystemd (see daemon.h). */
#include "daemon.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

int tq_sd_notify(const char *state) {
    const char *path = getenv("NOTIFY_SOCKET");
    if (!path || !path[0]) return 1;
    size_t n = strlen(path);
    struct sockaddr_un sa;
    memset(&sa, 0, sizeof sa);
    sa.sun_family = AF_UNIX;
    if (n >= sizeof sa.sun_path || (path[0] != '/' && path[0] != '@')) return -1;
    memcpy(sa.sun_path, path, n);
    if (path[0] == '@') sa.sun_path[0] = 0;   /* abstract namespace */
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + n + (path[0] == '/' ? 1 : 0));
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    /* A receiver that does not read (a full queue: net.unix.max_dgram_qlen, 10 by default)
     * must never stall the daemon: STATUS= is best effort (dropped at once), the others wait
     * at most 2 s. */
    int best_effort = !strncmp(state, "STATUS=", 7);
    struct timeval tv = { 2, 0 };
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    ssize_t w = sendto(fd, state, strlen(state), MSG_NOSIGNAL | (best_effort ? MSG_DONTWAIT : 0),
                       (struct sockaddr *)&sa, len);
    int e = errno;
    close(fd);
    errno = e;
    return w == (ssize_t)strlen(state) ? 0 : -1;
}

long long tq_sd_watchdog_usec(void) {
    const char *u = getenv("WATCHDOG_USEC"), *p = getenv("WATCHDOG_PID");
    if (!u) return 0;
    if (p && atoll(p) != (long long)getpid()) return 0;
    long long v = atoll(u);
    return v > 0 ? v : 0;
}
