/* gpuserve sandbox stand-in for libcuda.so.1 (the CUDA driver API). There is no GPU here.
 *
 * Answers cuInit and cuDeviceGetCount the way the real library would on this simulated host, so
 * gpuserve's CUDA-level check (python3 ctypes: cuInit + cuDeviceGetCount) is the same code as on
 * a real host:
 *   no loaded kernel module (/proc/driver/nvidia/version)        -> 100 CUDA_ERROR_NO_DEVICE
 *   this library's version (its file name, libcuda.so.<version>)
 *     differs from the loaded module's                           -> 803 CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
 *   NVSwitches present and the fabric manager not running        -> 802 CUDA_ERROR_SYSTEM_NOT_READY
 *   else cuDeviceGetCount = the GPUs in /etc/gpuserve-sim/hardware.json
 * Paths can be moved for tests: GPUSERVE_SIM_HARDWARE, GPUSERVE_SIM_PROC_DRIVER, GPUSERVE_SIM_FM_PIDFILE.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <dlfcn.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_INITIALIZED 3
#define CUDA_ERROR_NO_DEVICE 100
#define CUDA_ERROR_SYSTEM_NOT_READY 802
#define CUDA_ERROR_SYSTEM_DRIVER_MISMATCH 803

static int device_count = -1;

static const char *env_or(const char *name, const char *fallback) {
    const char *value = getenv(name);
    return value && *value ? value : fallback;
}

static size_t slurp(const char *path, char *buf, size_t size) {
    FILE *f = fopen(path, "r");
    size_t n;
    if (!f) return 0;
    n = fread(buf, 1, size - 1, f);
    buf[n] = 0;
    fclose(f);
    return n;
}

/* first whitespace-separated token of the form 123.45[.67] */
static int find_version(const char *text, char *out, size_t size) {
    const char *p = text;
    while (*p) {
        while (*p && isspace((unsigned char)*p)) p++;
        const char *start = p;
        while (*p && !isspace((unsigned char)*p)) p++;
        size_t len = (size_t)(p - start);
        if (len > 2 && len < size && isdigit((unsigned char)start[0]) && memchr(start, '.', len)) {
            size_t i;
            for (i = 0; i < len && (isdigit((unsigned char)start[i]) || start[i] == '.'); i++) {}
            if (i == len) {
                memcpy(out, start, len);
                out[len] = 0;
                return 1;
            }
        }
    }
    return 0;
}

static int own_version(char *out, size_t size) {
    Dl_info info;
    char real[PATH_MAX];
    const char *mark;
    if (!dladdr((void *)own_version, &info) || !info.dli_fname || !realpath(info.dli_fname, real)) return 0;
    mark = strstr(real, "libcuda.so.");
    if (!mark) return 0;
    snprintf(out, size, "%s", mark + strlen("libcuda.so."));
    return 1;
}

static int has_entries(const char *dir) {
    DIR *d = opendir(dir);
    struct dirent *e;
    int found = 0;
    if (!d) return 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] != '.') { found = 1; break; }
    }
    closedir(d);
    return found;
}

static int fabric_manager_running(void) {
    char buf[64];
    long pid;
    if (!slurp(env_or("GPUSERVE_SIM_FM_PIDFILE", "/run/nvidia-fabricmanager/nv-fabricmanager.pid"), buf, sizeof buf))
        return 0;
    pid = strtol(buf, NULL, 10);
    return pid > 0 && kill((pid_t)pid, 0) == 0;
}

int cuInit(unsigned int flags) {
    static char text[65536];
    char path[PATH_MAX], loaded[64], mine[64];
    const char *proc = env_or("GPUSERVE_SIM_PROC_DRIVER", "/proc/driver");
    const char *p;
    int n = 0;
    (void)flags;
    snprintf(path, sizeof path, "%s/nvidia/version", proc);
    if (!slurp(path, text, sizeof text) || !find_version(text, loaded, sizeof loaded))
        return CUDA_ERROR_NO_DEVICE;
    if (own_version(mine, sizeof mine) && strcmp(mine, loaded) != 0)
        return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    snprintf(path, sizeof path, "%s/nvidia-nvswitch/devices", proc);
    if (has_entries(path) && !fabric_manager_running())
        return CUDA_ERROR_SYSTEM_NOT_READY;
    if (!slurp(env_or("GPUSERVE_SIM_HARDWARE", "/etc/gpuserve-sim/hardware.json"), text, sizeof text))
        return CUDA_ERROR_NO_DEVICE;
    for (p = text; (p = strstr(p, "\"uuid\"")); p++) n++;
    if (n == 0) return CUDA_ERROR_NO_DEVICE;
    device_count = n;
    return CUDA_SUCCESS;
}

int cuDeviceGetCount(int *count) {
    if (device_count < 0) return CUDA_ERROR_NOT_INITIALIZED;
    *count = device_count;
    return CUDA_SUCCESS;
}

int cuDriverGetVersion(int *version) {
    *version = 13000;
    return CUDA_SUCCESS;
}
