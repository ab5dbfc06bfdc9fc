/* The embedded sites' guard on HTTP third-party copies (aso/local/xrootd.py preloads it into
 * each xrootd). XrdHttpTPC 5.5.3 trusts what a COPY names:
 * - its Source or Destination header goes to libcurl as it came, so `file:///...` made a site
 *   read any file its account could (the macaroon key, the host key) into a user's area, or
 *   empty one (storage round 1, F1 and F2). Every curl handle made in the server is limited
 *   to https, redirects too: a copy between sites needs nothing else, and http:// to loopback
 *   services is refused as well. If the limit cannot be set, no handle is given out.
 * - its request path reaches the file system with `..` in it (plain or %2e-encoded), after
 *   the authdb judged it by its first characters: `/store/temp/user/alice/../../../user/bob/x`
 *   overwrote bob's final file, and a push read files outside the export (storage round 3,
 *   T1 and T2). No file call under the export root (ASO_EXPORT_ROOT) may name a `..`
 *   component: nothing XRootD serves needs one (it resolves `..` in every other request). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>

typedef void CURL;
typedef CURL *(*init_fn)(void);
typedef void (*reset_fn)(CURL *);
typedef CURL *(*dup_fn)(CURL *);
typedef void (*cleanup_fn)(CURL *);
typedef int (*setopt_fn)(CURL *, int, ...);

/* curl/curl.h: CURLOPTTYPE_STRINGPOINT (10000) + 318 and + 319, libcurl 7.85 and later. */
#define CURLOPT_PROTOCOLS_STR 10318
#define CURLOPT_REDIR_PROTOCOLS_STR 10319
#define ALLOWED "https"

/* libcurl's own function: the next definition after this library, or libcurl's when it was
 * loaded in a scope of its own (dlopen of libXrdHttpTPC). */
static void *real(const char *name) {
    void *found = dlsym(RTLD_NEXT, name);
    if (found == NULL) {
        void *curl = dlopen("libcurl.so.4", RTLD_LAZY | RTLD_NOLOAD);
        if (curl != NULL) {
            found = dlsym(curl, name);
        }
    }
    return found;
}

/* Limit a handle to https; 0 when done. */
static int limit(CURL *handle) {
    setopt_fn setopt = (setopt_fn)real("curl_easy_setopt");
    return setopt == NULL || setopt(handle, CURLOPT_PROTOCOLS_STR, ALLOWED) != 0 ||
           setopt(handle, CURLOPT_REDIR_PROTOCOLS_STR, ALLOWED) != 0;
}

static CURL *https_only(CURL *handle) {
    if (handle != NULL && limit(handle) != 0) {
        cleanup_fn cleanup = (cleanup_fn)real("curl_easy_cleanup");
        if (cleanup != NULL) {
            cleanup(handle);
        }
        return NULL;
    }
    return handle;
}

CURL *curl_easy_init(void) {
    init_fn init = (init_fn)real("curl_easy_init");
    return init == NULL ? NULL : https_only(init());
}

CURL *curl_easy_duphandle(CURL *handle) {
    dup_fn dup = (dup_fn)real("curl_easy_duphandle");
    return dup == NULL ? NULL : https_only(dup(handle));
}

void curl_easy_reset(CURL *handle) {
    reset_fn reset = (reset_fn)real("curl_easy_reset");
    if (reset == NULL || handle == NULL) {
        return;
    }
    reset(handle);
    if (limit(handle) != 0) {
        abort(); /* its caller keeps the handle: it may not go on unguarded */
    }
}

/* -- paths ----------------------------------------------------------------------------------- */

/* Whether `path` (absolute under the export root, or relative) names a `..` component. */
static int escapes(const char *path) {
    static const char *root;
    static size_t root_len;
    static int known;
    if (!known) {
        root = getenv("ASO_EXPORT_ROOT");
        root_len = root == NULL ? 0 : strlen(root);
        known = 1;
    }
    if (path == NULL || (path[0] == '/' && (root_len == 0 || strncmp(path, root, root_len) != 0))) {
        return 0;
    }
    for (const char *dots = strstr(path, ".."); dots != NULL; dots = strstr(dots + 2, "..")) {
        int starts = dots == path || dots[-1] == '/';
        int ends = dots[2] == '\0' || dots[2] == '/';
        if (starts && ends) {
            return 1;
        }
    }
    return 0;
}

#define REFUSE(path)                                                                           \
    do {                                                                                       \
        if (escapes(path)) {                                                                   \
            errno = EACCES;                                                                    \
            return -1;                                                                         \
        }                                                                                      \
    } while (0)

static mode_t mode_of(int flags, va_list modes) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(modes, int) : 0;
}

int open(const char *path, int flags, ...) {
    va_list modes;
    va_start(modes, flags);
    mode_t mode = mode_of(flags, modes);
    va_end(modes);
    REFUSE(path);
    int (*next)(const char *, int, ...) = real("open");
    return next(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    va_list modes;
    va_start(modes, flags);
    mode_t mode = mode_of(flags, modes);
    va_end(modes);
    REFUSE(path);
    int (*next)(const char *, int, ...) = real("open64");
    return next(path, flags, mode);
}

int openat(int dir, const char *path, int flags, ...) {
    va_list modes;
    va_start(modes, flags);
    mode_t mode = mode_of(flags, modes);
    va_end(modes);
    REFUSE(path);
    int (*next)(int, const char *, int, ...) = real("openat");
    return next(dir, path, flags, mode);
}

int openat64(int dir, const char *path, int flags, ...) {
    va_list modes;
    va_start(modes, flags);
    mode_t mode = mode_of(flags, modes);
    va_end(modes);
    REFUSE(path);
    int (*next)(int, const char *, int, ...) = real("openat64");
    return next(dir, path, flags, mode);
}

int mkdir(const char *path, mode_t mode) {
    REFUSE(path);
    int (*next)(const char *, mode_t) = real("mkdir");
    return next(path, mode);
}

int unlink(const char *path) {
    REFUSE(path);
    int (*next)(const char *) = real("unlink");
    return next(path);
}

int rmdir(const char *path) {
    REFUSE(path);
    int (*next)(const char *) = real("rmdir");
    return next(path);
}

int rename(const char *from, const char *to) {
    REFUSE(from);
    REFUSE(to);
    int (*next)(const char *, const char *) = real("rename");
    return next(from, to);
}

int truncate(const char *path, off_t length) {
    REFUSE(path);
    int (*next)(const char *, off_t) = real("truncate");
    return next(path, length);
}

int truncate64(const char *path, off64_t length) {
    REFUSE(path);
    int (*next)(const char *, off64_t) = real("truncate64");
    return next(path, length);
}

int chmod(const char *path, mode_t mode) {
    REFUSE(path);
    int (*next)(const char *, mode_t) = real("chmod");
    return next(path, mode);
}
