/* The session runner, a bash loadable builtin: `__agent_bash_run STATUS_FIFO` never returns
 * while the backend talks to it; it reads each call from the shell's stdin and runs it the way
 * `bash -c` runs its string, so that the calls of a session are the successive lines of one
 * script (contract §5).
 *
 * Why a builtin: anything written in bash to run a call (`eval`, `.`, a function) shows
 * itself: an `eval:` in messages, a `source` frame for `caller`, BASH_SOURCE and RETURN traps,
 * deeper xtrace (`++++`), ERR traps firing again for the wrapper, `$?`/`$_`/PIPESTATUS reset
 * by the protocol's own commands, protocol variables in `compgen -v`, `s` in `$-`. Here the
 * call's text goes to `parse_and_execute(text, "-c", …)`, exactly what bash's `-c` does
 * (shell.c run_one_command), from a builtin that is itself the one command the shell's
 * top level ever runs after start-up: no bash code of ours runs between two calls, so what
 * a call leaves (`$?`, PIPESTATUS, `$_`, traps, LINENO's base) is what the next call starts
 * with, and what the protocol needs (the status FIFO's path, the protocol and stdout pipes)
 * lives in this file's C state, out of the shell's sight.
 *
 * A frame on stdin (the backend writes one only after the previous call's status):
 * `<payload length>\n` then `token\0cwd\0output fifo\0flags\0text`. Flags: `s` the text may go
 * to the spawn path (`agent_bash_try_spawn`, spawn.c); `p` run it in a forked copy
 * (run_forked); `t` a `| head`/`| tail` stage was stripped after a lone stage
 * (stage_stripped); `e` stderr goes to a FIFO of its own, the output's path and `.e`. The status line is `token status`, with ` x` when the shell traces. Per
 * call: stdin /dev/null, stdout and
 * stderr the output FIFO (and the descriptors above 2 an earlier call left on its output),
 * `cd -- cwd` (OLDPWD left as it was), the text, then descriptors 0-2 (and those above 2 on
 * the output) back to /dev/null and `token status` written to the status FIFO (opened by name
 * after the call, as before). A call that ends the script (`exit`, `set -e`, `set -u`)
 * ends the shell as `bash -c` would (its EXIT trap writing into the call's output), and the
 * backend sees the shell's stdout close.
 *
 * Symbols come from the bash that loads us (it exports them for loadable builtins); the ones
 * some versions lack are weak, and checked. Built with `-z now` (build.rs): a bash lacking a
 * strong one refuses the `enable -f`, and the session falls back to the plain-bash driver. */

#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <dirent.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
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
typedef int sh_builtin_func_t(WORD_LIST *);
struct builtin {
  char *name;
  sh_builtin_func_t *function;
  int flags;
  char *const *long_doc;
  const char *short_doc;
  char *handle;
};
/* The head of bash's SHELL_VAR (variables.h, the same from 3.2 to 5.3). */
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

extern int parse_and_execute(char *, const char *, int);
extern void *xmalloc(size_t);
extern void xfree(void *);
extern void exit_shell(int) __attribute__((noreturn));
extern int cd_builtin(WORD_LIST *);
extern SHELL_VAR *bind_variable(const char *, char *, int);
extern SHELL_VAR *find_variable(const char *);
extern int unbind_variable(const char *);
extern int array_needs_making, shell_initialized;
extern int echo_command_at_execute, echo_input_at_read, pipefail_opt;
extern void set_pipestatus_array(int *, int);
extern char *get_string_value(const char *);
extern void set_pipestatus_from_exit(int);
extern void unlink_fifo_list(void);
extern sigjmp_buf top_level;
extern int last_command_exit_value, line_number, read_from_stdin, want_pending_command,
    indirection_level, read_but_dont_execute;
extern char *this_command_name;
extern sh_builtin_func_t *this_shell_builtin;
/* Not in bash 3.2. */
extern int executing_builtin __attribute__((weak));
extern char *dollar_vars[];
extern struct builtin *shell_builtins;
extern int num_shell_builtins;
extern char **shell_environment;
extern const char *const dist_version;

extern int agent_bash_try_spawn(char *text, int *status);

/* bash's jump codes (bashjmp.h, 3.2 to 5.3) and parse_and_execute flags (builtins/common.h). */
#define FORCE_EOF 1
#define DISCARD 2
#define EXITPROG 3
#define ERREXIT 4
#define EXITBLTIN 6
#define SEVAL_NOHIST 0x004
#define SEVAL_RESETLINE 0x010

static int proto_fd = -1; /* the protocol's read end (was stdin) */
static int out_fd = -1;   /* the shell's stdout: its end tells the backend the shell exited */
static int null_fd = -1;  /* /dev/null, read-write */
static char *status_path;
static char *frame;
static size_t frame_cap;

/* A private copy of `fd` above the descriptors scripts use (bash's own start at 10, `exec
 * {v}>` too), close-on-exec so no command inherits it. */
static int hide_fd(int fd) {
  struct rlimit rl;
  int base = 1016;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 1024)
    base = rl.rlim_cur > 32 ? (int)rl.rlim_cur - 8 : 10;
  return fcntl(fd, F_DUPFD_CLOEXEC, base);
}

/* The next frame's payload into `frame` (its length in *len), or -1 at the protocol's end.
 * Nothing follows a frame in the pipe until its status is written, so a read may take all
 * there is: a frame usually comes in one read. */
static int next_frame(size_t *len) {
  size_t have = 0, need = 0, head = 0;
  for (;;) {
    if (frame_cap - have < 4096) {
      size_t cap = frame_cap ? frame_cap * 2 : 65536;
      char *bigger = realloc(frame, cap);
      if (!bigger)
        return -1;
      frame = bigger;
      frame_cap = cap;
    }
    ssize_t r = read(proto_fd, frame + have, frame_cap - have - 1);
    if (r < 0 && errno == EINTR)
      continue;
    if (r <= 0)
      return -1;
    have += (size_t)r;
    if (!head) {
      char *nl = memchr(frame, '\n', have);
      if (!nl)
        continue;
      head = (size_t)(nl - frame) + 1;
      for (char *d = frame; d < nl; d++) {
        if (*d < '0' || *d > '9' || d - frame > 9)
          return -1;
        need = need * 10 + (size_t)(*d - '0');
      }
    }
    if (have >= head + need)
      break;
  }
  if (have != head + need)
    return -1;
  memmove(frame, frame + head, need);
  frame[need] = '\0';
  *len = need;
  return 0;
}

/* The bash that loaded us, as major * 100 + minor (`5.2` is 502). */
static int version(void) {
  const char *dot;
  if (!dist_version)
    return 500;
  dot = strchr(dist_version, '.');
  return atoi(dist_version) * 100 + (dot ? atoi(dot + 1) : 0);
}

/* bash -c's flags for its string: 5.0 and later reset the line number; 3.2 and 4.x start
 * from the current one, which is 0 in `bash -c` (so `echo $LINENO` prints 0 there). */
static int c_flags(void) {
  return version() >= 500 ? SEVAL_NOHIST | SEVAL_RESETLINE : SEVAL_NOHIST;
}

/* OLDPWD as it was: whether it existed, its value (NULL: none, as the invisible OLDPWD bash
 * 4.4+ makes at start-up when the environment has no directory for it) and attributes. */
struct saved_var {
  int existed;
  char *value;
  int attributes;
};

static struct saved_var save_var(const char *name) {
  struct saved_var s = {0, NULL, 0};
  SHELL_VAR *v = find_variable(name);
  if (v) {
    s.existed = 1;
    s.value = v->value ? strdup(v->value) : NULL;
    s.attributes = v->attributes;
  }
  return s;
}

static void restore_var(const char *name, struct saved_var *s) {
  SHELL_VAR *v;
  if (!s->existed) {
    unbind_variable(name);
    return;
  }
  v = bind_variable(name, s->value ? s->value : "", 0);
  if (v) {
    if (!s->value) {
      xfree(v->value);
      v->value = NULL;
    }
    v->attributes = s->attributes;
    array_needs_making = 1;
  }
  free(s->value);
  s->value = NULL;
}

/* Enters `cwd` as `builtin cd -- cwd` does, but leaves OLDPWD as it was: in the script a
 * session models (contract §5) only the user's own `cd` moves OLDPWD; entering the call's cwd
 * is the one listed difference, and it changes the directory and PWD only. 0 on success. */
static int enter(char *cwd) {
  char dashes[] = "--";
  WORD_DESC w1 = {dashes, 0}, w2 = {cwd, 0};
  WORD_LIST l2 = {NULL, &w2}, l1 = {&l2, &w1};
  char *pwd = get_string_value("PWD");
  char *saved_name = this_command_name;
  struct saved_var oldpwd;
  int st;
  /* Already there: only checking that the directory still exists matters. */
  if (pwd && strcmp(pwd, cwd) == 0 && access(".", X_OK) == 0)
    return 0;
  oldpwd = save_var("OLDPWD");
  this_command_name = "cd";
  line_number = 1;
  st = cd_builtin(&l1);
  this_command_name = saved_name;
  if (st == 0)
    restore_var("OLDPWD", &oldpwd);
  free(oldpwd.value);
  return st;
}

static void report(const char *token, int status) {
  char line[128];
  int fd, n;
  while ((fd = open(status_path, O_WRONLY | O_CLOEXEC)) < 0 && errno == EINTR)
    ;
  if (fd < 0)
    _exit(99);
  /* ` x`: the shell traces what it runs, so the backend strips no `| tail` from the next call
   * (contract §1: the stage's own trace, and the trace lines the limit would cut). */
  n = snprintf(line, sizeof line, "%s %d%s\n", token, status,
               echo_command_at_execute || echo_input_at_read ? " x" : "");
  if (write(fd, line, (size_t)n) != n)
    _exit(99);
  close(fd);
}

/* The call's output FIFO (device and inode), and the descriptors above 2 that an earlier call
 * pointed at its output (`exec 3>&1`): in a script they point at the script's output, so here
 * they point at each call's output in turn, and at /dev/null between calls (so that no
 * finished call's output stays open). */
static dev_t out_dev;
static ino_t out_ino;
#define MAX_FOLLOW 64
static int follow[MAX_FOLLOW];
static int n_follow;
/* The call's stderr FIFO when it has one of its own (flag `e`). */
static dev_t err_dev;
static ino_t err_ino;

static int open_write(const char *fifo) {
  int fd;
  while ((fd = open(fifo, O_WRONLY | O_CLOEXEC)) < 0 && errno == EINTR)
    ;
  return fd;
}

/* The output FIFO on 1 and 2 and on the descriptors that follow the output, /dev/null on 0.
 * With `apart`, stderr goes to the FIFO named by the output's path and `.e` (contract §1: the
 * stderr of a command whose `| head`/`| tail` stage was stripped, which bash prints past the
 * stage). */
static int redirect(const char *fifo, int apart) {
  int fd, efd = -1;
  struct stat st;
  err_ino = 0;
  if (apart) {
    size_t n = strlen(fifo);
    char *path = malloc(n + 3);
    if (!path)
      return -1;
    memcpy(path, fifo, n);
    memcpy(path + n, ".e", 3);
    efd = open_write(path);
    free(path);
    if (efd < 0)
      return -1;
    if (fstat(efd, &st) == 0) {
      err_dev = st.st_dev;
      err_ino = st.st_ino;
    }
  }
  fd = open_write(fifo);
  if (fd < 0) {
    if (efd >= 0)
      close(efd);
    return -1;
  }
  if (fstat(fd, &st) == 0) {
    out_dev = st.st_dev;
    out_ino = st.st_ino;
  }
  dup2(null_fd, 0);
  dup2(fd, 1);
  dup2(efd >= 0 ? efd : fd, 2);
  /* What a call writes to a descriptor that follows the output is no line of the pipeline
   * that lost its stage: it goes past the stage too, with the stderr. */
  for (int i = 0; i < n_follow; i++)
    dup2(efd >= 0 ? efd : fd, follow[i]);
  close(fd);
  if (efd >= 0)
    close(efd);
  return 0;
}

/* Finds the descriptors above 2 that hold the call's output (the ones this shell keeps: what
 * a call started has its own copies), remembers them, and points them at /dev/null. */
static void release_output(void) {
  DIR *d = opendir("/proc/self/fd");
  struct dirent *e;
  struct stat st;
  n_follow = 0;
  if ((!out_ino && !err_ino) || !d) {
    if (d)
      closedir(d);
    return;
  }
  while ((e = readdir(d)) != NULL) {
    int fd = atoi(e->d_name);
    if (fd <= 2 || fd == dirfd(d) || fd == proto_fd || fd == out_fd || fd == null_fd)
      continue;
    if (fstat(fd, &st) != 0)
      continue;
    /* A copy of the output, or of a stderr of its own: both are the script's output. */
    int on_err = err_ino && st.st_dev == err_dev && st.st_ino == err_ino;
    if (!on_err && (st.st_dev != out_dev || st.st_ino != out_ino))
      continue;
    if (n_follow < MAX_FOLLOW)
      follow[n_follow++] = fd;
    dup2(null_fd, fd);
  }
  closedir(d);
}

static void unredirect(void) {
  fflush(stdout);
  fflush(stderr);
  release_output();
  dup2(null_fd, 0);
  dup2(null_fd, 1);
  dup2(null_fd, 2);
}

/* Runs `text` as `bash -c` does; a call that ends the script ends the shell here (in a child
 * made by run_forked: the child, with that status and without the EXIT trap, as a subshell). What bash
 * -c has when it starts its string: the reader loop's level of xtrace indirection not entered
 * (PS4 is shown once, not twice), no builtin running (a syntax error's status is then 2, as
 * parse.y gives it outside a builtin), line 0. */
static int run_text(char *text, int child) {
  sigjmp_buf saved;
  volatile int code;
  int level = indirection_level;
  size_t n = strlen(text);
  char *copy = xmalloc(n + 1);
  memcpy(copy, text, n + 1);
  memcpy(saved, top_level, sizeof saved);
  line_number = 0;
  indirection_level = 0;
  this_shell_builtin = NULL;
  if (&executing_builtin)
    executing_builtin = 0;
  code = sigsetjmp(top_level, 0);
  if (code == 0) {
    parse_and_execute(copy, "-c", c_flags());
    memcpy(top_level, saved, sizeof saved);
    indirection_level = level;
    /* An exit status, as the script's end would take it (4.4 leaves a syntax error's 257). */
    last_command_exit_value &= 0xff;
    return last_command_exit_value;
  }
  memcpy(top_level, saved, sizeof saved);
  unlink_fifo_list();
  switch (code) {
  case FORCE_EOF:
    last_command_exit_value = 127;
    break;
  case DISCARD:
    last_command_exit_value = 1;
    break;
  default: /* ERREXIT, EXITPROG, EXITBLTIN */
    break;
  }
  if (child) {
    fflush(stdout);
    fflush(stderr);
    _exit(last_command_exit_value & 0xff);
  }
  exit_shell(last_command_exit_value);
}

/* Runs `text` in a forked copy of the shell, as `( … )` would: for a text that ends inside
 * `$(`, whose failed parse leaves bash 5.2's parser reading outside its buffers later (the
 * copy's parser is thrown away). What its lines change is lost with the copy; the output and
 * the status are the same, as the text ends in a syntax error anyway. */
static int run_forked(char *text) {
  sigset_t chld, old;
  int st = 0;
  pid_t pid;
  fflush(stdout);
  fflush(stderr);
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  sigprocmask(SIG_BLOCK, &chld, &old);
  pid = fork();
  if (pid == 0) {
    sigprocmask(SIG_SETMASK, &old, NULL);
    st = run_text(text, 1);
    fflush(stdout);
    fflush(stderr);
    _exit(st & 0xff);
  }
  if (pid > 0) {
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
      ;
  }
  sigprocmask(SIG_SETMASK, &old, NULL);
  if (pid < 0)
    st = 1;
  else
    st = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  last_command_exit_value = st;
  set_pipestatus_from_exit(st);
  return st;
}

/* The call was `a | tail -n N` (or `| head`) run as `( a )` (contract §1): what the script
 * would hold after the real stage, which ends with status 0: PIPESTATUS `a`'s then 0, `$?` 0
 * (`a`'s under pipefail). The reported status stays `a`'s (§1). */
static void stage_stripped(int status) {
  int ps[2] = {status, 0};
  set_pipestatus_array(ps, 2);
  last_command_exit_value = pipefail_opt ? status : 0;
}

static void run_call(char *payload, size_t len) {
  char *field[5];
  char *p = payload, *end = payload + len;
  int status;
  for (int i = 0; i < 4; i++) {
    char *z = memchr(p, '\0', (size_t)(end - p));
    if (!z)
      _exit(98);
    field[i] = p;
    p = z + 1;
  }
  field[4] = p;
  if (redirect(field[2], strchr(field[3], 'e') != NULL) < 0) {
    last_command_exit_value = 1;
    set_pipestatus_from_exit(1);
    report(field[0], 1);
    return;
  }
  /* What `bash -c` holds: the string it runs. */
  bind_variable("BASH_EXECUTION_STRING", field[4], 0);
  if (enter(field[1]) != 0) {
    status = 1;
    last_command_exit_value = status;
    set_pipestatus_from_exit(status);
  } else if (strchr(field[3], 's') && agent_bash_try_spawn(field[4], &status)) {
    ;
  } else if (strchr(field[3], 'p')) {
    status = run_forked(field[4]);
  } else {
    status = run_text(field[4], 0);
    /* `set -n`: the script runs nothing more, as `bash -c` ends there; a session that can
     * run nothing more ends too (the next call gets a fresh shell). */
    if (read_but_dont_execute)
      exit_shell(last_command_exit_value);
    if (strchr(field[3], 't'))
      stage_stripped(status);
  }
  unlink_fifo_list();
  unredirect();
  report(field[0], status);
}

/* Every copy of the shell bash forks (a subshell, a pipeline stage, a background job, before an
 * exec) closes the protocol's descriptors: no command, builtin or not, can read the next
 * call's frame or hold the shell's stdout open (contract §5: the command cannot reach the
 * protocol). posix_spawn runs no fork handlers; its child execs, and they are close-on-exec. */
static void close_in_child(void) {
  if (proto_fd >= 0)
    close(proto_fd);
  if (out_fd >= 0)
    close(out_fd);
  if (null_fd >= 0)
    close(null_fd);
  proto_fd = out_fd = null_fd = -1;
}

static int run_builtin(WORD_LIST *);

/* Takes this builtin out of bash's table once it runs (the table stays sorted; the function
 * and its library stay, running): `type`, `enable -a` and `compgen -b` show nothing of ours. */
static void hide_self(void) {
  for (int i = 0; i < num_shell_builtins; i++) {
    if (shell_builtins[i].function == run_builtin) {
      memmove(&shell_builtins[i], &shell_builtins[i + 1],
              (size_t)(num_shell_builtins - i) * sizeof *shell_builtins);
      num_shell_builtins--;
      return;
    }
  }
}

static int run_builtin(WORD_LIST *list) {
  size_t len;
  char *under;
  SHELL_VAR *v;
  if (proto_fd >= 0 || !list || !list->word || list->next)
    return 2;
  status_path = strdup(list->word->word);
  null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (!status_path || null_fd < 0)
    return 1;
  proto_fd = hide_fd(0);
  out_fd = hide_fd(1);
  {
    int high = hide_fd(null_fd);
    close(null_fd);
    null_fd = high;
  }
  if (proto_fd < 0 || out_fd < 0 || null_fd < 0 || pthread_atfork(NULL, NULL, close_in_child))
    return 1;
  unredirect();
  hide_self();
  /* `$-` as in `bash -c`: `c`, not `s` (which_set_flags). */
  read_from_stdin = 0;
  want_pending_command = 1;
  /* What `bash -c` starts with: `$?` 0, and `$_` from the environment bash started with
   * (bash's own getenv would give the shell variable), else `$0`. */
  under = dollar_vars[0] ? dollar_vars[0] : "";
  for (char **e = shell_environment; e && *e; e++)
    if (strncmp(*e, "_=", 2) == 0)
      under = *e + 2;
  v = bind_variable("_", under, 0);
  if (v)
    v->attributes &= ~ATT_EXPORTED;
  /* No PIPESTATUS yet, as `bash -c` has none until its first command ends (the start-up
   * script's commands made one). */
  last_command_exit_value = 0;
  unbind_variable("PIPESTATUS");
  /* bash -c runs its string before bash counts itself initialized, 5.3 after: a function then
   * names its source `environment` (3.2 to 5.2) or `$0` (5.3) in BASH_SOURCE, not `main`. */
  shell_initialized = version() >= 503;
  while (next_frame(&len) == 0)
    run_call(frame, len);
  exit_shell(last_command_exit_value);
}

static char *const run_doc[] = {"Runs the session's calls (agent-bash).", NULL};

struct builtin __agent_bash_run_struct = {"__agent_bash_run", run_builtin, 1 /* BUILTIN_ENABLED */,
                                          run_doc, "__agent_bash_run status-fifo", NULL};
