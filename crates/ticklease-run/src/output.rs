//! The runner's own stdout and stderr: what its children write and its log.
//! Each stream is written by a thread of its own from a bounded queue, so
//! a pipe no one reads (a stalled log shipper) delays no renewal and no
//! decision: past [`QUEUE_MAX`] pieces waiting, a piece is dropped and
//! counted, and once the pipe takes writes again (before the next piece,
//! after a second with none, and at exit) one line says how many were
//! dropped. A closed pipe drops everything, silently.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::OnceLock;
use std::time::Duration;

/// Pieces (lines of at most 16 KiB, log records) waiting per stream: at
/// most about 4 MiB held for a pipe no one reads.
pub const QUEUE_MAX: usize = 256;

/// One of the runner's output streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Out,
    Err,
}

enum Piece {
    Bytes(Vec<u8>),
    Flushed(SyncSender<()>),
}

struct Writer {
    queue: SyncSender<Piece>,
    dropped: AtomicU64,
}

fn writer(stream: Stream) -> &'static Writer {
    static OUT: OnceLock<Writer> = OnceLock::new();
    static ERR: OnceLock<Writer> = OnceLock::new();
    let cell = match stream {
        Stream::Out => &OUT,
        Stream::Err => &ERR,
    };
    cell.get_or_init(|| {
        let (queue, pieces) = sync_channel(QUEUE_MAX);
        std::thread::Builder::new()
            .name(format!("ticklease-{stream:?}").to_lowercase())
            .spawn(move || drain(stream, pieces))
            .expect("an output thread");
        Writer {
            queue,
            dropped: AtomicU64::new(0),
        }
    })
}

/// Queues `bytes` for `stream` without waiting; false when it was dropped
/// (the queue is full: the stream's reader is not reading).
pub fn write(stream: Stream, bytes: Vec<u8>) -> bool {
    let w = writer(stream);
    match w.queue.try_send(Piece::Bytes(bytes)) {
        Ok(()) => true,
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            w.dropped.fetch_add(1, Ordering::Relaxed);
            false
        }
    }
}

/// Pieces dropped so far on `stream` because its reader did not keep up.
pub fn dropped(stream: Stream) -> u64 {
    writer(stream).dropped.load(Ordering::Relaxed)
}

/// Waits at most `within` for what is queued on both streams to be
/// written (before the process exits; a stalled reader is not waited for).
pub fn flush(within: Duration) {
    let deadline = std::time::Instant::now() + within;
    for stream in [Stream::Out, Stream::Err] {
        let (done, flushed) = sync_channel(1);
        if writer(stream).queue.try_send(Piece::Flushed(done)).is_ok() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let _ = flushed.recv_timeout(left);
        }
    }
}

/// How long the writer waits for a piece before it reports drops anyway.
const NOTE_AFTER: Duration = Duration::from_secs(1);

fn drain(stream: Stream, pieces: Receiver<Piece>) {
    let mut reported = 0;
    loop {
        match pieces.recv_timeout(NOTE_AFTER) {
            Ok(Piece::Bytes(bytes)) => {
                note_drops(stream, &mut reported);
                put(stream, &bytes);
            }
            Ok(Piece::Flushed(done)) => {
                note_drops(stream, &mut reported);
                let _ = done.try_send(());
            }
            Err(RecvTimeoutError::Timeout) => note_drops(stream, &mut reported),
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// One line saying how many pieces were dropped since the last such line.
fn note_drops(stream: Stream, reported: &mut u64) {
    let dropped = writer(stream).dropped.load(Ordering::Relaxed);
    if dropped > *reported {
        let note = format!(
            "ticklease: {} pieces of output dropped: this stream was not read\n",
            dropped - *reported
        );
        *reported = dropped;
        put(stream, note.as_bytes());
    }
}

fn put(stream: Stream, bytes: &[u8]) {
    let _ = match stream {
        Stream::Out => std::io::stdout().lock().write_all(bytes),
        Stream::Err => std::io::stderr().lock().write_all(bytes),
    };
}

/// The runner's stderr for its log: a `std::io::Write` over [`write()`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        write(Stream::Err, buf.to_vec());
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
