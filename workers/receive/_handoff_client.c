/* packyard-receive-pack: the client of workers/receive/handoff.py in C, run where git-receive-pack would be.
 *
 * Why: a push handed to a running `packyard http` costs the client side only what it takes to start, and a
 * Python interpreter with packyard's CLI takes ~20 ms to start: more than half of git's whole 10-commit push
 * (docs/receive.md, Figures). This program starts in about a millisecond.
 *
 * It does exactly what hand_over() in handoff.py does (that Python is its specification, and the fallback):
 *   - the same arguments as `packyard receive-pack` (REPO, --advertise-refs / --http-backend-info-refs,
 *     --stateless-rpc, -q / --quiet);
 *   - the socket path as workers/envpaths.py computes it from PACKYARD_RECEIVE_SOCKET and PACKYARD_STATE_DIR;
 *   - the header byte for byte as Python's json.dumps writes it, with descriptors 0, 1 and 2 (SCM_RIGHTS);
 *   - the server's uid checked (SO_PEERCRED: this user or root); `taken` or `busy`; then `exit <status>`.
 * Whenever the Python would run the push itself (no socket, a stale one, another user's, busy, a timeout)
 * or when anything here is not the plain case (an unknown option, a non-ASCII path, a setting this program
 * does not read), it execs `packyard receive-pack` with the same arguments, before any stream is touched:
 * the Python then decides and reports. A server gone mid-push: git's `fatal:` line and exit 128.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#define MAX_SOCKET_PATH 107           /* envpaths.MAX_SOCKET_PATH */
#define HANDSHAKE_TIMEOUT_S 10        /* handoff.HANDSHAKE_TIMEOUT */
#define MAX_HEADER 16384              /* handoff.MAX_HEADER */

static int saved_argc;
static char **saved_argv;

/* Run the Python `packyard receive-pack` with this program's arguments: the `packyard` beside this
 * executable (the same install), else the first on PATH. `skip_socket`: the server was asked already
 * (busy, or not this user's): the Python must not ask it again. */
static void run_python(int skip_socket) {
    char self[PATH_MAX], script[PATH_MAX + 16];
    char **args = calloc((size_t)saved_argc + 2, sizeof(char *));
    if (!args) { perror("packyard-receive-pack"); exit(128); }
    args[0] = "packyard";
    args[1] = "receive-pack";
    for (int i = 1; i < saved_argc; i++) args[i + 1] = saved_argv[i];
    if (skip_socket) setenv("PACKYARD_RECEIVE_SOCKET", "off", 1);
    ssize_t len = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (len > 0) {
        self[len] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            snprintf(script, sizeof(script), "%s/packyard", self);
            if (access(script, X_OK) == 0) execv(script, args);
        }
    }
    execvp("packyard", args);
    fprintf(stderr, "fatal: packyard-receive-pack: cannot run packyard: %s\n", strerror(errno));
    exit(128);
}

/* The socket path (envpaths.receive_socket); NULL: none (off, or the default path is too long); exits
 * through the Python for a value the Python must judge (a relative or too long PACKYARD_RECEIVE_SOCKET). */
static const char *socket_path(char *buf, size_t size) {
    const char *raw = getenv("PACKYARD_RECEIVE_SOCKET");
    if (raw && *raw) {
        if (!strcasecmp(raw, "off") || !strcasecmp(raw, "none") || !strcmp(raw, "0")) return NULL;
        if (raw[0] != '/' || strlen(raw) > MAX_SOCKET_PATH || isspace((unsigned char)raw[strlen(raw) - 1]))
            run_python(0);      /* ~, blanks to strip, relative, too long: the Python strips, expands, reports */
        snprintf(buf, size, "%s", raw);
        return buf;
    }
    const char *state = getenv("PACKYARD_STATE_DIR");
    char joined[PATH_MAX], real[PATH_MAX];
    if (state && *state) {
        if (state[0] == '~') run_python(0);
        snprintf(joined, sizeof(joined), "%s", state);
    } else {
        char cwd[PATH_MAX - 8];
        if (!getcwd(cwd, sizeof(cwd))) run_python(0);
        snprintf(joined, sizeof(joined), "%s/.state", cwd);
    }
    /* os.path.realpath: the directory as it resolves; one that does not exist has no server's socket */
    if (!realpath(joined, real)) return NULL;
    if ((size_t)snprintf(buf, size, "%s/receive.sock", real) > MAX_SOCKET_PATH) return NULL;
    return buf;
}

/* json.dumps of an ASCII string, as Python writes it; 0 when it does not fit or is not ASCII. */
static int json_string(char *out, size_t size, size_t *pos, const char *s) {
    static const char hex[] = "0123456789abcdef";
    char tmp[8];
    if (*pos + 1 >= size) return 0;
    out[(*pos)++] = '"';
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        const char *esc = NULL;
        size_t n;
        switch (*p) {
        case '"': esc = "\\\""; break;
        case '\\': esc = "\\\\"; break;
        case '\n': esc = "\\n"; break;
        case '\r': esc = "\\r"; break;
        case '\t': esc = "\\t"; break;
        case '\b': esc = "\\b"; break;
        case '\f': esc = "\\f"; break;
        default:
            if (*p >= 0x80) return 0;
            if (*p < 0x20 || *p == 0x7f) {   /* json's ensure_ascii: all but ' '..'~' */
                memcpy(tmp, "\\u00", 4);
                tmp[4] = hex[*p >> 4];
                tmp[5] = hex[*p & 15];
                tmp[6] = '\0';
                esc = tmp;
            }
        }
        n = esc ? strlen(esc) : 1;
        if (*pos + n + 1 >= size) return 0;
        if (esc) memcpy(out + *pos, esc, n); else out[*pos] = (char)*p;
        *pos += n;
    }
    if (*pos + 1 >= size) return 0;
    out[(*pos)++] = '"';
    return 1;
}

static int append(char *out, size_t size, size_t *pos, const char *s) {
    size_t n = strlen(s);
    if (*pos + n >= size) return 0;
    memcpy(out + *pos, s, n);
    *pos += n;
    return 1;
}

/* One `\n`-ended line (without it) into buf; 0 when the peer closed or failed first (handoff._read_line). */
static int read_line(int fd, char *buf, size_t size) {
    size_t len = 0;
    while (len < size - 1) {
        ssize_t n = recv(fd, buf + len, size - 1 - len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        len += (size_t)n;
        if (buf[len - 1] == '\n') {
            buf[len - 1] = '\0';
            return 1;
        }
    }
    return 0;
}

int main(int argc, char **argv) {
    saved_argc = argc;
    saved_argv = argv;
    const char *repo = NULL;
    int advertise = 0, stateless = 0, positional_only = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!positional_only && a[0] == '-' && a[1] != '\0') {
            if (!strcmp(a, "--")) positional_only = 1;
            else if (!strcmp(a, "--advertise-refs") || !strcmp(a, "--http-backend-info-refs")) advertise = 1;
            else if (!strcmp(a, "--stateless-rpc")) stateless = 1;
            else if (!strcmp(a, "-q") || !strcmp(a, "--quiet")) continue;
            else run_python(0);   /* --help, an abbreviation, a typo: argparse answers */
        } else if (repo) {
            run_python(0);        /* two repositories: argparse's error */
        } else {
            repo = a;
        }
    }
    if (!repo) run_python(0);

    char path[PATH_MAX];
    if (!socket_path(path, sizeof(path))) run_python(0);

    char header[MAX_HEADER];
    size_t pos = 0;
    const char *proto = getenv("GIT_PROTOCOL");
    if (!(append(header, sizeof(header), &pos, "{\"repo\": ") && json_string(header, sizeof(header), &pos, repo)
          && append(header, sizeof(header), &pos, advertise ? ", \"advertise_refs\": true" : ", \"advertise_refs\": false")
          && append(header, sizeof(header), &pos, stateless ? ", \"stateless\": true" : ", \"stateless\": false")
          && append(header, sizeof(header), &pos, ", \"git_protocol\": ")
          && json_string(header, sizeof(header), &pos, proto ? proto : "")
          && append(header, sizeof(header), &pos, "}")))
        run_python(0);        /* non-ASCII or very long: the Python's json writes it */

    int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (fd < 0) run_python(0);
    struct timeval tv = {HANDSHAKE_TIMEOUT_S, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, path, strlen(path) + 1);
    if (connect(fd, (struct sockaddr *)&addr, sizeof(addr)) != 0) {
        close(fd);
        run_python(0);        /* no server (or a stale socket): the Python finds the same and runs the push */
    }
    struct ucred cred;
    socklen_t cred_len = sizeof(cred);
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cred_len) != 0
        || (cred.uid != getuid() && cred.uid != 0)) {
        close(fd);
        run_python(1);        /* not our server: our streams are not handed to another account */
    }

    int fds[3] = {0, 1, 2};
    char control[CMSG_SPACE(sizeof(fds))];
    memset(control, 0, sizeof(control));
    struct iovec iov = {.iov_base = header, .iov_len = pos};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = control,
                         .msg_controllen = sizeof(control)};
    struct cmsghdr *cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(fds));
    memcpy(CMSG_DATA(cmsg), fds, sizeof(fds));
    char line[64];
    ssize_t sent;
    do sent = sendmsg(fd, &msg, MSG_NOSIGNAL); while (sent < 0 && errno == EINTR);
    if (sent != (ssize_t)pos || !read_line(fd, line, sizeof(line)) || strcmp(line, "taken") != 0) {
        close(fd);
        run_python(1);        /* busy, refused or silent: nothing of the streams was read; the push runs here */
    }
    tv.tv_sec = 0;            /* the push's own bounds are the server's */
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    int ok = read_line(fd, line, sizeof(line));
    close(fd);
    char *end = NULL;
    long status = ok && !strncmp(line, "exit ", 5) && line[5] >= '0' && line[5] <= '9'
                  ? strtol(line + 5, &end, 10) : -1;
    if (status < 0 || status > 255 || !end || *end != '\0') {
        static const char gone[] = "fatal: the receiving server went away during the push\n";
        if (write(2, gone, sizeof(gone) - 1) < 0) { /* nothing more to say */ }
        return 128;
    }
    return (int)status;
}
