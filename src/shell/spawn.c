/* The spawn path of the session runner (runner.c): runs a simple external command with
 * posix_spawn instead of bash's fork.
 *
 * Why: bash forks itself for every external command (page tables copied, copy-on-write faults
 * in both processes, the copy torn down again by exec). Measured on a 2-core VM, bash's
 * `/bin/true` costs 0.9 ms where a posix_spawn of it (clone with a shared address space) costs
 * 0.55-0.65 ms; spawning from a builtin inside the same bash costs 0.58-0.73 ms.
 *
 * The runner tries this for the calls the backend marks as one simple command of plain words (no quoting, expansion, redirection, assignment or
 * reserved word: see `fast_words` in local.rs). The child is started from inside bash, so it
 * inherits exactly what a forked child would: cwd, umask, limits, open descriptors (the
 * command's redirections are already in place), ignored signals, cgroup, Landlock fence.
 * Everything else bash would do differently is checked here first; when any check fails, or
 * the spawn itself fails (not found, not executable, no `#!` line, bad interpreter: posix_spawn
 * has no side effects then), the runner runs the text as `bash -c` does, so bash prints its own
 * message. What bash does after a simple command (`$?`, PIPESTATUS, `$_`) is done here too.
 *
 * Symbols below come from the bash executable that loads us (it exports them for loadable
 * builtins); the structures are bash's public loadable-builtin ABI (bash 3.2 to 5.3). */

#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct word_desc {
  char *word;
  int flags;
} WORD_DESC;
typedef struct word_list {
  struct word_list *next;
  WORD_DESC *word;
} WORD_LIST;
typedef struct shell_var {
  char *name;
  char *value;
  char *exportstr;
  void *dynamic_value;
  void *assign_func;
  int attributes;
  int context;
} SHELL_VAR;
#define ATT_EXPORTED 0x1

extern SHELL_VAR *bind_variable(const char *, char *, int);
extern void set_pipestatus_from_exit(int);
extern char *search_for_command(const char *, int);
extern void *find_function(const char *);
extern void *find_shell_builtin(char *);
extern void *find_alias(char *);
extern void maybe_make_export_env(void);
extern char *get_name_for_error(void);
extern char **export_env;
extern int interactive_shell, job_control, echo_command_at_execute, echo_input_at_read,
    place_keywords_in_env, posixly_correct, restricted, expand_aliases, line_number,
    exit_immediately_on_error, read_but_dont_execute, last_command_exit_value;
extern int signal_is_trapped(int);
extern int signal_is_ignored(int);
/* Not in bash 3.2, whose signal_is_ignored covers it. */
extern int signal_is_hard_ignored(int) __attribute__((weak));

/* bash's trap.h numbers its pseudo-signals after the real ones. */
#define DEBUG_TRAP NSIG
#define ERROR_TRAP (NSIG + 1)
/* bash's search_for_command flag: remember the path in the hash table, as running does. */
#define CMDSRCH_HASH 0x01
#define MAX_WORDS 256

/* Whether bash, in its current state, would run `name` as a plain external command and show
 * nothing of its own while doing so. */
static int plain_state(char *name) {
  if (interactive_shell || job_control || echo_command_at_execute || echo_input_at_read ||
      place_keywords_in_env || posixly_correct || restricted || exit_immediately_on_error ||
      read_but_dont_execute)
    return 0;
  if (signal_is_trapped(DEBUG_TRAP) || signal_is_trapped(ERROR_TRAP) ||
      signal_is_trapped(SIGCHLD))
    return 0;
  if (expand_aliases && find_alias(name))
    return 0;
  if (find_function(name) || find_shell_builtin(name))
    return 0;
  return 1;
}

/* What non-interactive bash prints when a foreground command dies of a signal (jobs.c,
 * notify_of_job_status, as built with DONT_REPORT_SIGTERM and DONT_REPORT_SIGPIPE: the
 * default configuration). */
static void report_signal(pid_t pid, int status, char *const argv[]) {
  int sig = WTERMSIG(status);
  const char *desc = strsignal(sig);
  int core = WCOREDUMP(status);
  if (sig == SIGINT || sig == SIGPIPE)
    return;
  if (!desc)
    desc = "Unknown signal";
  if (sig == SIGTERM || signal_is_trapped(sig)) {
    fprintf(stderr, "%s%s\n", desc, core ? " (core dumped)" : "");
  } else {
    int pad = 24 - (int)strlen(desc);
    fprintf(stderr, "%s: line %d: %5ld %s%*s%s", get_name_for_error(),
            line_number == 0 ? 1 : line_number, (long)pid, desc, pad < 0 ? 0 : pad, "",
            core ? "(core dumped) " : "");
    for (int i = 0; argv[i]; i++)
      fprintf(stderr, i ? " %s" : "%s", argv[i]);
    fputc('\n', stderr);
  }
  fflush(stderr);
}

/* What bash does after a simple command: the status, PIPESTATUS and `$_` (its last word, not
 * exported: execute_cmd.c bind_lastarg). */
static void after_command(int status, char *last) {
  SHELL_VAR *v;
  last_command_exit_value = status;
  set_pipestatus_from_exit(status);
  v = bind_variable("_", last, 0);
  if (v)
    v->attributes &= ~ATT_EXPORTED;
}

static int hard_ignored(int sig) {
  return signal_is_hard_ignored ? signal_is_hard_ignored(sig) : 0;
}

/* Runs `text` (one simple command of plain words) with posix_spawn when bash would run it as a
 * plain external command: 1 and its status in *out, else 0 (nothing done). */
int agent_bash_try_spawn(char *text, int *out) {
  char *argv[MAX_WORDS + 1];
  char *copy, *path, *word, *save = NULL;
  char **envp;
  int n = 0, envn = 0, err, status = 0;
  pid_t pid;
  sigset_t chld, old;
  posix_spawnattr_t attr;

  copy = strdup(text);
  if (!copy)
    return 0;
  for (word = strtok_r(copy, " \t\n", &save); word && n <= MAX_WORDS;
       word = strtok_r(NULL, " \t\n", &save))
    argv[n++] = word;
  if (n == 0 || n > MAX_WORDS || !plain_state(argv[0])) {
    free(copy);
    return 0;
  }
  argv[n] = NULL;
  char *last = argv[n - 1];
  path = search_for_command(argv[0], CMDSRCH_HASH);
  if (!path) {
    free(copy);
    return 0;
  }

  /* The environment a forked child would have: the exported variables, `_` set to the path. */
  maybe_make_export_env();
  while (export_env && export_env[envn])
    envn++;
  envp = malloc((envn + 2) * sizeof *envp);
  if (!envp) {
    free(path);
    free(copy);
    return 0;
  }
  n = 0;
  for (int i = 0; i < envn; i++)
    if (strncmp(export_env[i], "_=", 2) != 0)
      envp[n++] = export_env[i];
  char *under = malloc(strlen(path) + 3);
  if (under) {
    strcpy(under, "_=");
    strcat(under, path);
    envp[n++] = under;
  }
  envp[n] = NULL;

  /* SIGCHLD held while we wait, so bash's own handler does not reap our child first. The child
   * gets the signal mask bash had and the dispositions a forked child gets from bash
   * (restore_original_signals): a handler becomes the default (glibc does that in the child),
   * and so does a signal bash ignores for itself (SIGQUIT, …); only signals ignored when bash
   * started, or by `trap '' SIG`, stay ignored: every other signal goes in the default set
   * (bash's own bookkeeping says which, no system call; glibc's child sets each anyway). glibc's
   * own signals (32, 33), which bash cannot change, keep bash's disposition, as through fork:
   * glibc's posix_spawn would ignore them in the child, so they go in the default set too (by
   * hand: sigaddset refuses them) unless bash has them ignored (asked of the kernel once: glibc's
   * sigaction refuses them too, and nothing in bash can change them). */
  static int internal_ignored = -1;
  sigset_t deflt;
  sigemptyset(&deflt);
  for (int sig = 1; sig < NSIG; sig++) {
    if (sig != SIGKILL && sig != SIGSTOP && !hard_ignored(sig) && !signal_is_ignored(sig))
      sigaddset(&deflt, sig);
  }
  if (internal_ignored < 0) {
    internal_ignored = 0;
    for (int sig = 32; sig <= 33; sig++) {
      struct {
        void *handler;
        unsigned long flags;
        void *restorer;
        unsigned long mask;
      } k;
      if (syscall(SYS_rt_sigaction, sig, NULL, &k, sizeof k.mask) == 0 && k.handler == SIG_IGN)
        internal_ignored |= 1 << (sig - 32);
    }
  }
  for (int sig = 32; sig <= 33; sig++) {
    if (!(internal_ignored & (1 << (sig - 32)))) {
      unsigned long *bits = (unsigned long *)&deflt;
      bits[(sig - 1) / (8 * sizeof *bits)] |= 1UL << ((sig - 1) % (8 * sizeof *bits));
    }
  }
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old);
  posix_spawnattr_init(&attr);
  posix_spawnattr_setsigmask(&attr, &old);
  posix_spawnattr_setsigdefault(&attr, &deflt);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  err = posix_spawn(&pid, path, NULL, &attr, argv, envp);
  posix_spawnattr_destroy(&attr);
  if (err == 0) {
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
      ;
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  free(under);
  free(envp);
  free(path);
  if (err != 0) {
    free(copy);
    return 0;
  }
  line_number = 1;
  if (WIFSIGNALED(status)) {
    report_signal(pid, status, argv);
    *out = 128 + WTERMSIG(status);
  } else {
    *out = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  }
  after_command(*out, last);
  free(copy);
  return 1;
}
