//! The read loop of a run, written once for the three shells (contract §5): cancel, timeout,
//! output into the feed, the head-only rule's close (contract §1), idle ticks, and the
//! background-wait rules once the foreground part has ended.
//!
//! What differs between the shells is where output and the foreground's end come from (an
//! output FIFO and a status FIFO, a pipe and the child's exit, frames over the engine's
//! stdout): that is a [`Transport`]. How a run is cleaned up afterwards (a kill ladder and a
//! drain, a `K` frame) stays with each shell.
//!
//! # Background-wait rules
//! Once the foreground part has ended, background jobs may still hold the output: the run
//! keeps reading while output keeps coming, and ends once it has been idle for
//! [`BACKGROUND_IDLE`], or [`BACKGROUND_CAP`] after the foreground ended, or as soon as no
//! writer holds the output or we closed it. Cancel and timeout count only while the
//! foreground part runs.

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use super::session::{Ending, OutputSink, RunError, BACKGROUND_CAP, BACKGROUND_IDLE, IDLE_TICK};

/// What the loop knows, handed to the transport with each wait.
#[derive(Debug, Clone, Copy)]
pub(super) struct Phase {
    /// The foreground part has not ended yet.
    pub running: bool,
    /// Output is still wanted: no end of file seen, not closed by us.
    pub reading: bool,
}

/// What a transport reports.
#[derive(Debug)]
pub(super) enum Event {
    /// Bytes of output, in [`Transport::chunk`].
    Output,
    /// No writer holds the output any more.
    OutputEnd,
    /// The foreground part ended this way (its status, or the shell's own end).
    Foreground(Ending),
    /// The run ends now, with no background wait.
    End(Ending),
    /// The run failed.
    Fail(RunError),
    /// Nothing for the loop (a frame of an earlier command).
    Nothing,
}

/// Where output and the foreground's end come from.
pub(super) trait Transport: Send {
    /// What [`Transport::wait`] woke up for.
    type Wake: Send;

    /// Waits for the next thing to happen. Cancel-safe: dropped whenever another branch of the
    /// loop wins (a cancel, a timer), so it only waits; [`Transport::handle`] does the rest.
    async fn wait(&mut self, phase: Phase) -> Self::Wake;

    /// What a wake-up means; runs to completion.
    async fn handle(&mut self, wake: Self::Wake, phase: Phase) -> Event;

    /// The bytes of the last [`Event::Output`] (or of [`Transport::read_pending`]).
    fn chunk(&self) -> &[u8];

    /// The chunk is the command's stderr, kept apart ([`OutputSink::stderr_apart`]).
    fn chunk_apart(&self) -> bool {
        false
    }

    /// Stops reading the output: the producer gets SIGPIPE.
    async fn close_output(&mut self);

    /// Whether the feed's time bound may close the output now.
    fn closable(&self) -> bool {
        true
    }

    /// When the next tick is due while the foreground runs.
    fn tick_at(&self) -> Instant {
        Instant::now() + IDLE_TICK
    }

    /// A tick: `Some(event)` stands in for the feed's idle call this time.
    fn tick(&mut self) -> Option<Event> {
        None
    }

    /// After the feed's idle call: an ending when the shell can never finish the command.
    fn stuck(&self, _eof: bool) -> Option<Ending> {
        None
    }

    /// Right after the foreground ended: what it wrote, read without waiting. `(bytes now in
    /// [`Transport::chunk`], more may come)`.
    fn read_pending(&mut self) -> (bool, bool) {
        (false, true)
    }

    /// After [`Transport::read_pending`], when a writer still holds the output: keep reading
    /// it. False when that cannot be done (the output is then dropped).
    fn keep_reading(&mut self) -> bool {
        true
    }
}

/// How the loop ended.
#[derive(Debug, Clone, Copy)]
pub(super) struct LoopEnd {
    pub ending: Ending,
    /// No writer holds the output any more.
    pub eof: bool,
    /// We closed the output (the feed asked for it).
    pub closed_early: bool,
}

/// A timer that never fires within a run.
const FAR: Duration = Duration::from_secs(365 * 24 * 3600);

struct State {
    eof: bool,
    closed_early: bool,
    /// The foreground's ending and when it came.
    fg: Option<(Ending, Instant)>,
    last_data: Instant,
}

impl State {
    /// Whether the background wait is over (see the module docs).
    fn done(&self) -> Option<Ending> {
        let (end, at) = self.fg?;
        let now = Instant::now();
        let over = self.eof
            || self.closed_early
            || now >= at + BACKGROUND_CAP
            || now >= self.last_data + BACKGROUND_IDLE;
        over.then_some(end)
    }

    /// When the background wait must be looked at again.
    fn bg_wake(&self, far: Instant) -> Instant {
        self.fg.map_or(far, |(_, at)| (at + BACKGROUND_CAP).min(self.last_data + BACKGROUND_IDLE))
    }

    /// Hands the transport's chunk to the feed; closes the output when the feed asks.
    async fn deliver<T: Transport>(&mut self, t: &mut T, out: &mut dyn OutputSink) {
        self.last_data = Instant::now();
        if t.chunk_apart() {
            out.apart(t.chunk());
        } else if !self.closed_early && !out.data(t.chunk()) {
            self.closed_early = true;
            t.close_output().await;
        }
    }

    /// The foreground part just ended: what it wrote is read now; a background job that holds
    /// the output is watched from now on.
    async fn foreground_ended<T: Transport>(
        &mut self,
        end: Ending,
        t: &mut T,
        out: &mut dyn OutputSink,
    ) {
        if self.fg.is_some() {
            return;
        }
        self.fg = Some((end, Instant::now()));
        if self.eof {
            return;
        }
        let (got, more) = t.read_pending();
        self.eof = !more;
        if got {
            self.deliver(t, out).await;
        }
        if !self.eof && !t.keep_reading() {
            self.eof = true;
        }
    }

    /// Applies an event; `Some` ends the run.
    async fn apply<T: Transport>(
        &mut self,
        ev: Event,
        t: &mut T,
        out: &mut dyn OutputSink,
    ) -> Option<Result<Ending, RunError>> {
        match ev {
            Event::Output => self.deliver(t, out).await,
            Event::OutputEnd => self.eof = true,
            Event::Foreground(end) => self.foreground_ended(end, t, out).await,
            Event::End(end) => return Some(Ok(end)),
            Event::Fail(e) => return Some(Err(e)),
            Event::Nothing => {}
        }
        None
    }
}

/// Runs the loop until the command has ended (see the module docs).
pub(super) async fn read_loop<T: Transport>(
    t: &mut T,
    out: &mut dyn OutputSink,
    deadline: Option<Instant>,
    cancel: &CancellationToken,
) -> Result<LoopEnd, RunError> {
    let far = Instant::now() + FAR;
    let mut s = State { eof: false, closed_early: false, fg: None, last_data: Instant::now() };
    let ending = loop {
        if let Some(end) = s.done() {
            break end;
        }
        let bg_wake = s.bg_wake(far);
        let running = s.fg.is_none();
        let phase = Phase { running, reading: !s.eof && !s.closed_early };
        let close_at = if phase.reading && t.closable() { out.close_at() } else { None };
        let tick_at = t.tick_at();
        tokio::select! {
            biased;
            _ = cancel.cancelled(), if running => break Ending::Cancelled,
            _ = tokio::time::sleep_until(deadline.unwrap_or(far).into()), if running && deadline.is_some() => break Ending::TimedOut,
            wake = t.wait(phase) => {
                let ev = t.handle(wake, phase).await;
                if let Some(end) = s.apply(ev, t, out).await {
                    break end?;
                }
            }
            _ = tokio::time::sleep_until(close_at.unwrap_or(far).into()), if close_at.is_some() => {
                s.closed_early = true;
                t.close_output().await;
            }
            _ = tokio::time::sleep_until(bg_wake.into()), if !running => {}
            _ = tokio::time::sleep_until(tick_at.into()), if running => {
                match t.tick() {
                    Some(ev) => {
                        if let Some(end) = s.apply(ev, t, out).await {
                            break end?;
                        }
                    }
                    None => {
                        out.idle();
                        if let Some(end) = t.stuck(s.eof) {
                            break end;
                        }
                    }
                }
            }
        }
    };
    Ok(LoopEnd { ending, eof: s.eof, closed_early: s.closed_early })
}
