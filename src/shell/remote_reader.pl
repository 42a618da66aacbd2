# agent-bash remote reader, fast path (contract §12): the same protocol as the bash reader of
# remote_driver.sh, in one process when the remote side has perl (no fork per command). It
# starts the shell (bash in a session of its own), forwards command lines to it through a FIFO,
# reads every command's output FIFO with select(2) and writes frames (each in one write of at
# most 4096 bytes), reports the shell's exit, and kills the shell's tree on `K` or at the end
# of its input. Arguments: NONCE MARK DIR QUOTED-DIR.
use strict;
use warnings;
use POSIX qw(mkfifo setsid WNOHANG EAGAIN EINTR);
use Fcntl qw(O_RDONLY O_NONBLOCK);
my ($n, $mark, $d, $q) = @ARGV;
$SIG{PIPE} = 'IGNORE';
$SIG{CHLD} = sub { };
mkfifo("$d/c", 0600) or die "mkfifo: $!";
my $m = fork();
die "fork: $!" unless defined $m;
if ($m == 0) {
  $SIG{PIPE} = 'DEFAULT';
  $SIG{CHLD} = 'DEFAULT';
  setsid();
  open(STDIN, '<', "$d/c") or POSIX::_exit(127);
  $ENV{AGENT_BASH_REMOTE_MARK} = $mark;
  exec('bash', '--noprofile', '--norc') or POSIX::_exit(127);
}
open(my $c, '>', "$d/c") or die "open: $!";
binmode STDOUT;
binmode STDIN;
my %out;
my $m_alive = 1;

sub emit {
  my ($f) = @_;
  my $o = 0;
  while ($o < length $f) {
    my $w = syswrite(STDOUT, $f, length($f) - $o, $o);
    if (!defined $w) { next if $! == EINTR; return }
    $o += $w;
  }
}

sub to_shell {
  my ($line) = @_;
  my $o = 0;
  $line .= "\n";
  while ($o < length $line) {
    my $w = syswrite($c, $line, length($line) - $o, $o);
    if (!defined $w) { next if $! == EINTR; return }
    $o += $w;
  }
}

sub reap {
  return unless $m_alive;
  if (waitpid($m, WNOHANG) == $m) {
    $m_alive = 0;
    my $st = $?;
    my $code = ($st & 127) ? 128 + ($st & 127) : $st >> 8;
    emit("$n X $code\n");
  }
}

# Reads what one output FIFO has: frames, or its end.
sub pump {
  my ($s) = @_;
  my $fh = $out{$s};
  my $r = sysread($fh, my $buf, 65536);
  if (!defined $r) {
    return if $! == EAGAIN || $! == EINTR;
    $r = 0;
  }
  if ($r == 0) {
    close $fh;
    delete $out{$s};
    unlink "$d/o.$s";
    emit("$n F $s\n");
    return;
  }
  for (my $o = 0; $o < $r; $o += 4000) {
    my $chunk = substr($buf, $o, 4000);
    emit("$n O $s " . length($chunk) . "\n" . $chunk);
  }
}

sub marked {
  my @p;
  opendir(my $dh, '/proc') or return ();
  for my $e (readdir $dh) {
    next unless $e =~ /^\d+$/;
    next if $e == $$;
    open(my $fh, '<', "/proc/$e/environ") or next;
    local $/;
    my $env = <$fh>;
    next unless defined $env;
    push @p, $e if index("\0$env\0", "\0AGENT_BASH_REMOTE_MARK=$mark\0") >= 0;
  }
  return @p;
}

sub group_alive { return kill(0, -$m) }

# TERM to the shell's process group and every process carrying the mark, 500 ms of grace,
# then KILL until none is left (at most about 2 s more).
sub killall {
  kill('TERM', -$m);
  my @p = marked();
  kill('TERM', @p) if @p;
  for (1 .. 10) {
    reap();
    last unless group_alive() || marked();
    select(undef, undef, undef, 0.05);
  }
  for (1 .. 20) {
    kill('KILL', -$m);
    @p = marked();
    kill('KILL', @p) if @p;
    select(undef, undef, undef, 0.02);
    reap();
    last unless group_alive() || @p;
    select(undef, undef, undef, 0.1);
  }
}

# After a kill: what the tree wrote before it died is still in the FIFOs.
sub drain {
  my $until = time + 0.2;
  while (%out && time < $until) {
    my $rin = '';
    vec($rin, fileno($out{$_}), 1) = 1 for keys %out;
    my $nf = select(my $rout = $rin, undef, undef, 0.05);
    last if $nf == 0;
    next if $nf < 0;
    for my $s (sort { $a <=> $b } keys %out) {
      pump($s) if vec($rout, fileno($out{$s}), 1);
    }
  }
}

sub finish {
  my ($ack) = @_;
  killall();
  drain();
  emit("$n K\n") if $ack;
  close $_ for values %out;
  close $c;
  opendir(my $dh, $d);
  unlink map { "$d/$_" } grep { !/^\.\.?$/ } readdir $dh;
  rmdir $d;
  exit 0;
}

to_shell("exec {__ab_st}>&1;__ab_n=$n;__ab_d=$q;\\builtin shopt -s expand_aliases;"
  . "\\builtin printf '%s R %s %s\\n' \"\$__ab_n\" \"\$\$\" \"\$HOSTNAME\" >&\$__ab_st");
my $in = '';
while (1) {
  my $rin = '';
  vec($rin, fileno(STDIN), 1) = 1;
  vec($rin, fileno($out{$_}), 1) = 1 for keys %out;
  my $nf = select(my $rout = $rin, undef, undef, 1);
  reap();
  next if $nf <= 0;
  for my $s (sort { $a <=> $b } keys %out) {
    pump($s) if vec($rout, fileno($out{$s}), 1);
  }
  next unless vec($rout, fileno(STDIN), 1);
  my $r = sysread(STDIN, my $buf, 65536);
  if (!defined $r) { next if $! == EAGAIN || $! == EINTR; $r = 0 }
  finish(0) if $r == 0;
  $in .= $buf;
  while ((my $i = index($in, "\n")) >= 0) {
    my $line = substr($in, 0, $i);
    $in = substr($in, $i + 1);
    if ($line =~ /^C (\d+) (.*)\z/s) {
      my $s = $1;
      if (!$out{$s}) {
        unlink "$d/o.$s";
        mkfifo("$d/o.$s", 0600) or next;
        sysopen(my $fh, "$d/o.$s", O_RDONLY | O_NONBLOCK) or next;
        $out{$s} = $fh;
      }
      to_shell($2);
    } elsif ($line =~ /^X (\d+)\z/) {
      if (my $fh = delete $out{$1}) { close $fh; unlink "$d/o.$1" }
    } elsif ($line =~ /^E (.*)\z/s) {
      to_shell($1);
    } elsif ($line eq 'K') {
      finish(1);
    }
  }
}
