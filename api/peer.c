/* peer.c — identity from the kernel (see peer.h). */
#include "peer.h"

#include <dirent.h>
#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

void tq_peer_name(uid_t uid, char *out, size_t n) {
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res) snprintf(out, n, "%s", pw.pw_name);
    else snprintf(out, n, "uid%u", (unsigned)uid);
}

static int is_loopback(const struct sockaddr_storage *a) {
    if (a->ss_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)a)->sin_addr.s_addr) >> 24) == 127;
    if (a->ss_family == AF_INET6) {
        const struct in6_addr *x = &((const struct sockaddr_in6 *)a)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(x)) return 1;
        return IN6_IS_ADDR_V4MAPPED(x) && x->s6_addr[12] == 127;
    }
    return 0;
}

/* the address and port of a as sock_diag wants them (network order); a v4-mapped IPv6 address
 * is the IPv4 socket it is */
static void diag_addr(const struct sockaddr_storage *a, int *family, __be32 addr[4], __be16 *port) {
    memset(addr, 0, 16);
    if (a->ss_family == AF_INET) {
        const struct sockaddr_in *v = (const struct sockaddr_in *)a;
        *family = AF_INET;
        addr[0] = v->sin_addr.s_addr;
        *port = v->sin_port;
        return;
    }
    const struct sockaddr_in6 *v = (const struct sockaddr_in6 *)a;
    *port = v->sin6_port;
    if (IN6_IS_ADDR_V4MAPPED(&v->sin6_addr)) {
        *family = AF_INET;
        memcpy(&addr[0], &v->sin6_addr.s6_addr[12], 4);
    } else {
        *family = AF_INET6;
        memcpy(addr, &v->sin6_addr, 16);
    }
}

/* The uid owning the client's end of a loopback TCP connection: the socket whose source is the
 * peer and whose destination is us. 0 found. */
static int loopback_uid(const struct sockaddr_storage *peer, const struct sockaddr_storage *local, uid_t *uid) {
    int nl = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
    if (nl < 0) return -1;
    struct timeval tv = { 1, 0 };
    setsockopt(nl, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    struct {
        struct nlmsghdr nlh;
        struct inet_diag_req_v2 r;
    } req;
    memset(&req, 0, sizeof req);
    req.nlh.nlmsg_len = sizeof req;
    req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
    req.nlh.nlmsg_flags = NLM_F_REQUEST;
    req.nlh.nlmsg_seq = 1;
    int fam_p, fam_l;
    diag_addr(peer, &fam_p, req.r.id.idiag_src, &req.r.id.idiag_sport);
    diag_addr(local, &fam_l, req.r.id.idiag_dst, &req.r.id.idiag_dport);
    req.r.sdiag_family = (__u8)fam_p;
    req.r.sdiag_protocol = IPPROTO_TCP;
    req.r.idiag_states = ~0U;
    req.r.id.idiag_cookie[0] = req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
    struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
    int rc = -1;
    if (sendto(nl, &req, sizeof req, 0, (struct sockaddr *)&kernel, sizeof kernel) == (ssize_t)sizeof req) {
        long buf[2048];
        ssize_t k = recv(nl, buf, sizeof buf, 0);
        for (struct nlmsghdr *h = (struct nlmsghdr *)buf; k > 0 && NLMSG_OK(h, (size_t)k); h = NLMSG_NEXT(h, k)) {
            if (h->nlmsg_type == NLMSG_ERROR || h->nlmsg_type == NLMSG_DONE) break;
            if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY) continue;
            const struct inet_diag_msg *m = NLMSG_DATA(h);
            *uid = m->idiag_uid;
            rc = 0;
            break;
        }
    }
    close(nl);
    return rc;
}

static void primary_gid(uid_t uid, gid_t *gid) {
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) == 0 && res) *gid = pw.pw_gid;
}

void tq_peer_of(struct MHD_Connection *conn, tq_peer *p) {
    memset(p, 0, sizeof *p);
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!ci) return;
    int fd = ci->connect_fd;
    struct sockaddr_storage local, peer;
    socklen_t ll = sizeof local, pl = sizeof peer;
    if (getsockname(fd, (struct sockaddr *)&local, &ll)) return;
    if (local.ss_family == AF_UNIX) {
        struct ucred cr;
        socklen_t cl = sizeof cr;
        p->unix_socket = 1;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0) {
            p->known = 1;
            p->uid = cr.uid;
            p->gid = cr.gid;
        }
    } else {
        if (getpeername(fd, (struct sockaddr *)&peer, &pl)) return;
        if (!is_loopback(&peer)) { p->remote = 1; return; }
        uid_t uid;
        if (loopback_uid(&peer, &local, &uid) == 0) {
            p->known = 1;
            p->uid = uid;
            p->gid = (gid_t)-1;
            primary_gid(uid, &p->gid);
        }
    }
    if (p->known) tq_peer_name(p->uid, p->user, sizeof p->user);
}

/* the groups of uid (primary and supplementary); returns the count (0 unknown) */
static int groups_of(uid_t uid, gid_t *out, int max) {
    struct passwd pw, *res = NULL;
    char buf[4096];
    if (getpwuid_r(uid, &pw, buf, sizeof buf, &res) || !res) return 0;
    int n = max;
    if (getgrouplist(pw.pw_name, pw.pw_gid, out, &n) < 0) return 0;
    return n;
}

int tq_peer_is_admin(uid_t uid, const char *admin_group) {
    if (uid == 0) return 1;
    if (!admin_group || !admin_group[0]) return 0;
    struct group gr, *res = NULL;
    char buf[8192];
    if (getgrnam_r(admin_group, &gr, buf, sizeof buf, &res) || !res) return 0;
    gid_t g[256];
    int n = groups_of(uid, g, 256);
    for (int i = 0; i < n; i++) if (g[i] == gr.gr_gid) return 1;
    return 0;
}

/* may uid (with groups g[0..ng)) do `want` (a mask of 4 read, 1 search/execute) on st? */
static int allowed(const struct stat *st, uid_t uid, const gid_t *g, int ng, int want) {
    if (uid == 0) return (want & 1) && S_ISREG(st->st_mode) ? (st->st_mode & 0111) != 0 : 1;
    int bits;
    if (st->st_uid == uid) bits = (st->st_mode >> 6) & 7;
    else {
        int in = 0;
        for (int i = 0; i < ng; i++) in |= g[i] == st->st_gid;
        bits = in ? (st->st_mode >> 3) & 7 : st->st_mode & 7;
    }
    return (bits & want) == want;
}

int tq_path_readable_by(const char *path, uid_t uid, char *real, size_t realn, char *why, size_t whyn) {
    char r[PATH_MAX];
    if (!realpath(path, r)) {
        snprintf(why, whyn, "%s: %s", path, strerror(errno));
        return -1;
    }
    snprintf(real, realn, "%s", r);
    gid_t g[256];
    int ng = groups_of(uid, g, 256);
    /* every directory on the way must be searchable */
    char walk[PATH_MAX];
    snprintf(walk, sizeof walk, "%s", r);
    for (char *s = walk + 1; ; s++) {
        char c = *s;
        if (c != '/' && c != 0) continue;
        *s = 0;
        struct stat st;
        int last = c == 0;
        if (stat(walk[0] ? walk : "/", &st)) { snprintf(why, whyn, "%s: %s", walk, strerror(errno)); return -1; }
        if (!last && !allowed(&st, uid, g, ng, 1)) {
            snprintf(why, whyn, "%s is not readable by uid %u: the directory %s is not searchable for it", path,
                     (unsigned)uid, walk);
            return -1;
        }
        if (last) {
            if (S_ISDIR(st.st_mode)) {
                if (!allowed(&st, uid, g, ng, 5)) {
                    snprintf(why, whyn, "%s is not readable by uid %u (directory %s)", path, (unsigned)uid, r);
                    return -1;
                }
                DIR *d = opendir(r);
                struct dirent *e;
                while (d && (e = readdir(d))) {
                    char f[PATH_MAX + 256];
                    struct stat fs;
                    snprintf(f, sizeof f, "%s/%s", r, e->d_name);
                    if (e->d_name[0] == '.' || stat(f, &fs) || !S_ISREG(fs.st_mode)) continue;
                    if (!allowed(&fs, uid, g, ng, 4)) {
                        snprintf(why, whyn, "%s is not readable by uid %u", f, (unsigned)uid);
                        closedir(d);
                        return -1;
                    }
                }
                if (d) closedir(d);
            } else if (!allowed(&st, uid, g, ng, 4)) {
                snprintf(why, whyn, "%s is not readable by uid %u", r, (unsigned)uid);
                return -1;
            }
            break;
        }
        *s = '/';
    }
    return 0;
}
