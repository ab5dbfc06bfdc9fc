/* The embedded sites' guard on HTTP third-party copies (aso/local/xrootd.py preloads it into
 * each xrootd). XrdHttpTPC 5.5.3 hands a COPY's Source or Destination header to libcurl as it
 * came, so `file:///...` made a site read any file its account could (the macaroon key, the
 * host key) into a user's area, or empty one (red team of the storage boundary, F1 and F2).
 * Every curl handle made in the server is limited to https, redirects too: a copy between
 * sites needs nothing else, and http:// to loopback services is refused as well. If the limit
 * cannot be set, no handle is given out: the copy fails rather than go unguarded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdlib.h>

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
