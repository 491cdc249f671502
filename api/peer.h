/* peer.h — who is on the other end of a connection, from the kernel: no passwords.
 *
 * On the unix socket the peer's uid comes from SO_PEERCRED; on loopback TCP the kernel knows
 * which uid owns the client's end of the connection, and sock_diag (NETLINK_SOCK_DIAG, an exact
 * 4-tuple lookup with inet_diag_req_v2) tells; a connection from another host has no identity.
 * Also: whether a uid may administer (root, or a member of the admin group), and whether a path
 * is readable by a uid and its groups (the check a submission's data_dir and init_from get, so
 * that the daemon never reads for a user what that user could not read).
 *
 * Contract: thread-safe (no shared state); never exits; a failed lookup is an unknown peer. */
#ifndef TQ_PEER_H
#define TQ_PEER_H
#include <stddef.h>
#include <sys/types.h>

struct MHD_Connection;

typedef struct {
    int known;          /* the uid below is the kernel's word */
    int remote;         /* TCP from a non-loopback address (no identity possible) */
    int unix_socket;    /* came over the unix socket */
    uid_t uid;
    gid_t gid;          /* primary group (from the passwd entry when known) */
    char user[64];      /* user name, or "uid1234" when the uid has no passwd entry */
} tq_peer;

/* Fills *p for the connection (p->known 0 when the kernel could not say). */
void tq_peer_of(struct MHD_Connection *conn, tq_peer *p);
/* The uid's user name into out ("uid1234" without a passwd entry). */
void tq_peer_name(uid_t uid, char *out, size_t n);
/* 1 when uid is root or a member of group `admin_group` (its primary group or a supplementary). */
int tq_peer_is_admin(uid_t uid, const char *admin_group);
/* 0 when `path` — resolved (symlinks followed) into real[] — can be read by uid with its
 * groups: every directory on the way searchable, the file readable, or for a directory
 * readable and searchable together with every regular file directly in it. -1 with why[]
 * naming the path otherwise (or when it does not exist). */
int tq_path_readable_by(const char *path, uid_t uid, char *real, size_t realn, char *why, size_t whyn);
#endif
