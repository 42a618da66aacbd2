# agent-bash remote driver (contract §12). Sent over the engine's stdin and run as
#   bash --noprofile --norc -c "$driver" agent-bash-remote NONCE MARK ENCODER
# This process is the *reader*: it owns the byte stream from agent-bash (stdin) and never runs a
# user command. The user's commands run in a second bash (the *shell*), which reads protocol
# lines from a FIFO and keeps its state between commands; it runs in a session (and process
# group) of its own, so a cancel kills its whole tree. Every byte sent back on stdout is a frame
# that starts with the nonce; command output travels inside length-prefixed frames, so no output
# can ever be read as a frame. Each frame is written with one write(2) of at most 4096 bytes,
# which a pipe keeps whole even when several writers share it.
#
# Frames (remote → agent-bash): `N R <host>` ready; `N O <seq> <len>\n<bytes>` output;
# `N F <seq>` end of output; `N D <seq> <status>` foreground done; `N E <seq>` the cwd is not a
# directory; `N X <status>` the shell exited; `N K` a kill finished.
# Lines (agent-bash → remote): `C <seq> <shell line>` run; `X <seq>` stop reading the output of
# <seq>; `K` kill the shell's tree and end. End of input also kills the tree and ends.
__n=$1 __mark=$2 __encoder=$3
umask 077
__d=$(mktemp -d "${TMPDIR:-/tmp}/agent-bash-remote.XXXXXX") || {
  printf '%s L cannot create a temporary directory\n' "$__n"
  exit 1
}
if [ "$__encoder" = auto ] && command -v perl >/dev/null 2>&1; then
  __encoder=perl
else
  __encoder=sh
fi
# The output encoder of one command: reads the command's FIFO until every writer closed it.
__pl='my($n,$s)=@ARGV;binmode STDIN;binmode STDOUT;my $b;
while(1){my $r=sysread(STDIN,$b,4000);if(!defined $r){next if $!{EINTR};last}last if $r==0;
my $f="$n O $s ".length($b)."\n".$b;my $o=0;while($o<length $f){my $w=syswrite(STDOUT,$f,length($f)-$o,$o);last unless defined $w;$o+=$w}}
syswrite(STDOUT,"$n F $s\n");'
__encsh() {
  local f=$__d/e.$1 len
  while :; do
    dd bs=4000 count=1 of="$f" 2>/dev/null
    len=$(wc -c <"$f") || break
    len=${len//[!0-9]/}
    [ "${len:-0}" -gt 0 ] || break
    { printf '%s O %s %s\n' "$__n" "$1" "$len"; cat "$f"; } >"$f.f"
    cat "$f.f"
  done
  rm -f "$f" "$f.f"
  printf '%s F %s\n' "$__n" "$1"
}
# Prepares seq $1: its FIFO and an encoder waiting on it (off the command's critical path).
__prep() {
  mkfifo "$__d/o.$1" || return
  if [ "$__encoder" = perl ]; then
    perl -e "$__pl" "$__n" "$1" <"$__d/o.$1" 8>&- &
  else
    __encsh "$1" <"$__d/o.$1" 8>&- &
  fi
  __enc[$1]=$!
}
# The files the shell sources: `run` for each command, and the one-line `bash` that runs the
# command itself (a sourced file numbers its lines from 1, and its name is what error messages
# show: `bash: line 1: …`, as `bash -c` prints). No reserved word and no unescaped builtin, so a
# broken previous command or a user's alias changes nothing.
printf '%s\n' \
  '__ab_o=$OLDPWD;__ab_p=$PWD;__ab_x=0' \
  '\builtin test -z "$__ab_c" || \builtin test -d "$__ab_c" || __ab_x=1' \
  '\builtin test -z "$__ab_c" || \builtin test "${__ab_c#/}" != "$__ab_c" || __ab_c=$PWD/$__ab_c' \
  '\builtin test "$__ab_x" = 0 || \builtin printf '"'"'%s E %s\n'"'"' "$__ab_n" "$__ab_s" >&$__ab_st' \
  '\builtin test "$__ab_x" = 0 || \builtin : >"$__ab_d/o.$__ab_s"' \
  '\builtin test "$__ab_x" = 1 || \builtin shopt -u sourcepath' \
  '\builtin test "$__ab_x" = 1 || \builtin cd -- "$__ab_d" || __ab_x=1' \
  '\builtin test "$__ab_x" = 1 || \builtin . bash >"$__ab_d/o.$__ab_s" 2>&1 </dev/null;__ab_r=$?' \
  '\builtin test "$__ab_x" = 1 || \builtin printf '"'"'%s D %s %d\n'"'"' "$__ab_n" "$__ab_s" "$__ab_r" >&$__ab_st || \builtin exit 99' \
  >"$__d/run"
printf '%s\n' \
  '\builtin cd -- "${__ab_c:-$__ab_p}";OLDPWD=$__ab_o;\builtin eval "$__ab_cmd" {__ab_st}>&-' \
  >"$__d/bash"
printf -v __q %q "$__d"
# With perl, one process does the reader's work without a fork per command (remote_reader.pl,
# appended to this text by agent-bash as the function __reader_pl).
[ "$__encoder" = perl ] && exec perl -e "$__reader_pl" "$__n" "$__mark" "$__d" "$__q"
command -v setsid >/dev/null 2>&1 || {
  printf '%s L setsid is not installed on the remote side\n' "$__n"
  rm -rf "$__d"
  exit 1
}
mkfifo "$__d/c" || exit 1
# The shell; when it exits (`exit`, `exec`, a crash, a kill) its status is reported.
(
  AGENT_BASH_REMOTE_MARK=$__mark setsid bash --noprofile --norc <"$__d/c"
  printf '%s X %d\n' "$__n" $?
) &
__w=$!
exec 8>"$__d/c"
__m=
declare -a __enc
__prep 1
__marked() {
  local p f
  for f in $(grep -las "AGENT_BASH_REMOTE_MARK=$__mark" /proc/[0-9]*/environ 2>/dev/null); do
    p=${f#/proc/}
    p=${p%/environ}
    [ "$p" = $$ ] || printf '%s\n' "$p"
  done
}
# TERM to the shell's process group and every process carrying the mark (also those that left
# the group with setsid), 500 ms of grace, then KILL; returns once none is left (or after 3 s).
__killall() {
  local i p left
  [ -n "$__m" ] && kill -TERM -- "-$__m" 2>/dev/null
  for p in $(__marked); do kill -TERM "$p" 2>/dev/null; done
  for i in 1 2 3 4 5 6 7 8 9 10; do
    left=$( { [ -n "$__m" ] && kill -0 -- "-$__m" 2>/dev/null && echo g; } ; __marked)
    [ -z "$left" ] && break
    sleep 0.05
  done
  for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    [ -n "$__m" ] && kill -KILL -- "-$__m" 2>/dev/null
    left=$(__marked)
    [ -z "$left" ] && ! { [ -n "$__m" ] && kill -0 -- "-$__m" 2>/dev/null; } && break
    for p in $left; do kill -KILL "$p" 2>/dev/null; done
    sleep 0.1
  done
}
__end() {
  local p
  __killall
  # Encoders drain what the tree wrote, then end on their own; the one waiting for a next
  # command that never comes is stopped.
  sleep 0.1
  for p in "${__enc[@]}"; do kill "$p" 2>/dev/null; done
  kill "$__w" 2>/dev/null
  rm -rf "$__d"
}
# Start-up of the shell: the status fd, the environment, aliases on; then the ready frame.
printf '%s\n' "exec {__ab_st}>&1;__ab_n=$__n;__ab_d=$__q;\\builtin shopt -s expand_aliases;\\builtin printf '%s R %s %s\\n' \"\$__ab_n\" \"\$\$\" \"\$HOSTNAME\" >&\$__ab_st" >&8
while IFS= read -r __l; do
  case $__l in
  C\ *)
    __s=${__l#C }
    __s=${__s%% *}
    [ -p "$__d/o.$__s" ] || __prep "$__s"
    printf '%s\n' "${__l#C * }" >&8
    __prep $((__s + 1))
    ;;
  X\ *)
    __s=${__l#X }
    [ -n "${__enc[$__s]}" ] && kill "${__enc[$__s]}" 2>/dev/null
    ;;
  P\ *) __m=${__l#P } ;;
  E\ *) printf '%s\n' "${__l#E }" >&8 ;;
  K)
    __end
    printf '%s K\n' "$__n"
    exit 0
    ;;
  esac
done
__end
