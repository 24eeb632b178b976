/* A power-cut model for one directory tree, as an LD_PRELOAD library (tests/test_power_loss.py).
 *
 * The live directory plays the page cache: every write lands there at once, as on a real system.
 * What a power cut would keep is recorded beside it, in a shadow directory, at the only moments a
 * program can make data durable:
 *
 *   fsync(fd) / fdatasync(fd) on a regular file under $PL_ROOT  -> the file's bytes at that moment,
 *                                                               under the file's identity
 *   fsync(fd) / fdatasync(fd) on a directory under $PL_ROOT     -> its entries (name -> identity,
 *                                                               type) at that moment
 *
 * (identity = inode number + birth time, so a reused inode number is not mistaken for the old
 * file). After the process is killed, the test rebuilds the tree from the shadow alone: a name
 * exists only if its directory was synced while it was there, and a file holds only the bytes it
 * had when it was last synced (nothing, if never). Everything else -- unsynced data, renames,
 * links, unlinks and new files whose directory was not synced afterwards -- is lost, as after a
 * power cut on a file system that promises nothing more than POSIX does. sync(), syncfs(),
 * sync_file_range() and msync() are not modelled (treated as doing nothing): nothing overnight
 * or SQLite relies on for durability uses them.
 *
 * The shadow is written before the real call, one record at a time per process, each to a
 * temporary name and renamed into place, so a kill at any instant leaves a consistent shadow
 * (data recorded a moment before the sync completed is data a disk may legally have written
 * early). $PL_ROOT and $PL_SHADOW are read at every call.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <dlfcn.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int (*real_fsync)(int);
static int (*real_fdatasync)(int);
static atomic_uint counter;
/* one record at a time: two threads syncing one directory must not leave the older listing last */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((constructor)) static void init(void) {
    real_fsync = dlsym(RTLD_NEXT, "fsync");
    real_fdatasync = dlsym(RTLD_NEXT, "fdatasync");
}

/* read at every call: a process may point itself at another tree (os.environ[...] = ...) */
static const char *shadow;

/* identity and type ('f' file, 'd' directory, 'o' other) of dirfd/name (name "" : dirfd itself) */
static int identity(int dirfd, const char *name, char *out, size_t n, char *type) {
    struct statx st;
    int flags = AT_SYMLINK_NOFOLLOW | (*name ? 0 : AT_EMPTY_PATH);
    if (statx(dirfd, name, flags, STATX_INO | STATX_TYPE | STATX_BTIME, &st) != 0)
        return -1;
    unsigned long long born = (st.stx_mask & STATX_BTIME)
        ? (unsigned long long)st.stx_btime.tv_sec * 1000000000ULL + st.stx_btime.tv_nsec : 0;
    snprintf(out, n, "%llx-%llx", (unsigned long long)st.stx_ino, born);
    *type = S_ISDIR(st.stx_mode) ? 'd' : S_ISREG(st.stx_mode) ? 'f' : 'o';
    return 0;
}

static void temp_name(char *out, size_t n) {
    snprintf(out, n, "%s/tmp/%d-%d-%u", shadow, getpid(), gettid(), atomic_fetch_add(&counter, 1));
}

static void copy_file(const char *from, const char *to) {
    char tmp[PATH_MAX], buf[65536];
    temp_name(tmp, sizeof tmp);
    int in = open(from, O_RDONLY | O_CLOEXEC);
    if (in < 0) return;
    int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0) { close(in); return; }
    ssize_t got;
    while ((got = read(in, buf, sizeof buf)) > 0) {
        for (ssize_t done = 0; done < got;) {
            ssize_t w = write(out, buf + done, got - done);
            if (w <= 0) { close(in); close(out); unlink(tmp); return; }
            done += w;
        }
    }
    close(in);
    close(out);
    rename(tmp, to);
}

static void list_dir(const char *path, const char *to, int is_root, const char *key) {
    char tmp[PATH_MAX];
    temp_name(tmp, sizeof tmp);
    int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return;
    DIR *d = fdopendir(dfd);
    if (!d) { close(dfd); return; }
    FILE *out = fopen(tmp, "we");
    if (!out) { closedir(d); return; }
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        char k[64], t;
        if (identity(dfd, e->d_name, k, sizeof k, &t) == 0)
            fprintf(out, "%c %s %s\n", t, k, e->d_name);
    }
    fclose(out);
    closedir(d);
    rename(tmp, to);
    if (is_root) {
        char rt[PATH_MAX], rp[PATH_MAX];
        temp_name(rt, sizeof rt);
        snprintf(rp, sizeof rp, "%s/root", shadow);
        FILE *f = fopen(rt, "we");
        if (f) { fputs(key, f); fclose(f); rename(rt, rp); }
    }
}

static void record(int fd) {
    const char *root = getenv("PL_ROOT");
    shadow = getenv("PL_SHADOW");
    if (!root || !shadow || !*root) return;
    size_t rootlen = strlen(root);
    char link[64], path[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n < 0) return;
    path[n] = 0;
    if (strncmp(path, root, rootlen) != 0 || (path[rootlen] != 0 && path[rootlen] != '/')) return;
    char key[64], type, to[PATH_MAX];
    if (identity(fd, "", key, sizeof key, &type) != 0) return;
    if (type == 'f') {
        snprintf(to, sizeof to, "%s/data/%s", shadow, key);
        copy_file(link, to);
    } else if (type == 'd') {
        snprintf(to, sizeof to, "%s/dirs/%s", shadow, key);
        list_dir(link, to, path[rootlen] == 0, key);
    }
}

static void record_locked(int fd) {
    pthread_mutex_lock(&lock);
    record(fd);
    pthread_mutex_unlock(&lock);
}

int fsync(int fd) {
    record_locked(fd);
    return real_fsync(fd);
}

int fdatasync(int fd) {
    record_locked(fd);
    return real_fdatasync(fd);
}
