/* The one line of a rank that dies of a fatal signal (fednest_mpi.failure.FatalLine).
 *
 * A C-level abort() in a plugin, a segmentation fault: no Python code runs any more, so the line that names the
 * rank and the hook is written here, from the signal handler, with write(2) only (async-signal-safe): a prefix
 * and a suffix set when the run starts, the hook the rank is in (set by the oracle calls: fatal_line_hook), the
 * signal's name. Then the handler that was there before runs (faulthandler's: the Python stack into
 * RUN.h5.failed/fatal-rankR.log), and the signal ends the process as before.
 */
#include <signal.h>
#include <string.h>
#include <unistd.h>

#define LINE 1024
static char prefix[LINE], suffix[LINE], hook[LINE];
static size_t prefix_len, suffix_len;
static volatile size_t hook_len;
static const int fatal[] = {SIGABRT, SIGSEGV, SIGBUS, SIGFPE, SIGILL};
#define N_FATAL (sizeof fatal / sizeof fatal[0])
static struct sigaction previous[N_FATAL];
static int installed;

static void put(const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(2, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

static const char *name_of(int sig) {
    switch (sig) {
    case SIGABRT: return "SIGABRT (an abort)";
    case SIGSEGV: return "SIGSEGV (a segmentation fault)";
    case SIGBUS: return "SIGBUS (a bus error)";
    case SIGFPE: return "SIGFPE (an arithmetic fault)";
    default: return "SIGILL (an illegal instruction)";
    }
}

static void on_fatal(int sig, siginfo_t *info, void *context) {
    const char *name = name_of(sig);
    put(prefix, prefix_len);
    put(name, strlen(name));
    size_t n = hook_len;
    if (n > 0) {
        put(" in ", 4);
        put(hook, n);
    }
    put(suffix, suffix_len);
    put("\n", 1);
    for (size_t i = 0; i < N_FATAL; i++) {
        if (fatal[i] != sig) continue;
        struct sigaction *p = &previous[i];
        sigaction(sig, p, NULL); /* what was there: faulthandler's handler, or the default action */
        if ((p->sa_flags & SA_SIGINFO) && p->sa_sigaction != NULL)
            p->sa_sigaction(sig, info, context);
        else if (p->sa_handler != SIG_DFL && p->sa_handler != SIG_IGN)
            p->sa_handler(sig);
    }
    raise(sig); /* the previous handler returned (or was the default): the signal ends the process */
}

static size_t copy(char *to, const char *from) {
    size_t n = strlen(from);
    if (n >= LINE) n = LINE - 1;
    memcpy(to, from, n);
    to[n] = 0;
    return n;
}

/* Install the handler of the fatal signals over the present ones; the line is prefix SIGNAL [in HOOK] suffix. */
int fatal_line_install(const char *line_prefix, const char *line_suffix) {
    prefix_len = copy(prefix, line_prefix);
    suffix_len = copy(suffix, line_suffix);
    if (installed) return 0;
    struct sigaction action;
    memset(&action, 0, sizeof action);
    action.sa_sigaction = on_fatal;
    action.sa_flags = SA_SIGINFO | SA_NODEFER | SA_ONSTACK;
    sigemptyset(&action.sa_mask);
    for (size_t i = 0; i < N_FATAL; i++)
        if (sigaction(fatal[i], &action, &previous[i]) != 0) return -1;
    installed = 1;
    return 0;
}

/* Put the handlers that were there back. */
void fatal_line_uninstall(void) {
    if (!installed) return;
    for (size_t i = 0; i < N_FATAL; i++) sigaction(fatal[i], &previous[i], NULL);
    installed = 0;
    hook_len = 0;
}

/* The hook the rank runs now (n bytes of name), or none (n = 0). */
void fatal_line_hook(const char *name, size_t n) {
    hook_len = 0;
    if (n >= LINE) n = LINE - 1;
    memcpy(hook, name, n);
    hook_len = n;
}
