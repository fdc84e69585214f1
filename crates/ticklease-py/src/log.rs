//! The core's log lines into Python's `logging` (logger `ticklease`), each
//! field in the record's `extra` and after the message (`role=billing`).
//!
//! The core's threads never wait for the GIL: an event goes into a bounded
//! queue, and a thread of its own hands it to `logging`. A full queue (a
//! handler that blocks) drops lines and counts them; the next line that
//! gets through says how many.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Mutex, PoisonError};

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::{Context, Layer};

/// Lines waiting for the logging thread.
const QUEUE_MAX: usize = 4_096;

/// The lowest Python level passed on (`logging.INFO` until `set_level`).
static LEVEL: AtomicU8 = AtomicU8::new(20);
/// Lines dropped since the last one that got through.
static DROPPED: AtomicU64 = AtomicU64::new(0);
/// The queue of the process that started its thread (by pid: a forked
/// child starts its own).
static QUEUE: Mutex<Option<(u32, SyncSender<Line>)>> = Mutex::new(None);

struct Line {
    level: u8,
    message: String,
    fields: Vec<(&'static str, String)>,
}

/// Sets the lowest level passed on (a `logging` level number).
pub(crate) fn set_level(level: u8) {
    LEVEL.store(level, Ordering::Relaxed);
}

/// Installs the layer as the process's tracing subscriber (once; a host
/// that installed its own keeps it).
pub(crate) fn install() {
    use tracing_subscriber::layer::SubscriberExt;
    let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry().with(ToLogging));
}

fn python_level(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

struct ToLogging;

impl<S: Subscriber> Layer<S> for ToLogging {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let level = python_level(event.metadata().level());
        if level < LEVEL.load(Ordering::Relaxed) {
            return;
        }
        // deadpool's "could not be recycled" repeats what the core's one
        // line per failover says; its errors still pass.
        if event.metadata().target().starts_with("deadpool") && level < 40 {
            return;
        }
        let mut line = Line {
            level,
            message: String::new(),
            fields: Vec::new(),
        };
        event.record(&mut line);
        send(line);
    }
}

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.message, "{value:?}");
        } else {
            self.fields.push((field.name(), format!("{value:?}")));
        }
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            self.message.push_str(value);
        } else {
            self.fields.push((field.name(), value.to_owned()));
        }
    }
}

fn send(line: Line) {
    let pid = std::process::id();
    let mut queue = QUEUE.lock().unwrap_or_else(PoisonError::into_inner);
    let sender = match &*queue {
        Some((owner, sender)) if *owner == pid => sender.clone(),
        _ => {
            let (sender, receiver) = sync_channel::<Line>(QUEUE_MAX);
            // Started from any thread, Python's main one included: it blocks
            // the asynchronous signals first thing, as the runtime's threads do.
            let started = std::thread::Builder::new()
                .name("ticklease-log".into())
                .spawn(move || {
                    crate::runtime::block_signals();
                    log_thread(receiver)
                });
            if started.is_err() {
                return;
            }
            *queue = Some((pid, sender.clone()));
            sender
        }
    };
    drop(queue);
    match sender.try_send(line) {
        Ok(()) => {}
        Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Hands the queue's lines to `logging`. The thread keeps one Python thread
/// state for its life (attached once, the GIL released while it waits): a
/// thread state made and freed per line takes the interpreter's head lock
/// each time, which a `fork` in another thread could catch held. It takes
/// the GIL again only through the gate; once the gate is closed (the
/// interpreter is finishing) it never does.
fn log_thread(receiver: std::sync::mpsc::Receiver<Line>) {
    // Borrowed while the GIL is released: shared, so behind a (never contended) lock.
    let receiver = Mutex::new(receiver);
    let Some(first) = crate::runtime::enter() else {
        return;
    };
    let mut pass = Some(first);
    Python::attach(|py| loop {
        let next = py.detach(|| {
            drop(pass.take());
            let next = receiver.lock().unwrap_or_else(PoisonError::into_inner).recv();
            match crate::runtime::enter() {
                Some(p) => (p, next),
                // The interpreter is finishing: never return (returning takes the GIL again).
                None => loop {
                    std::thread::park();
                },
            }
        });
        let (p, next) = next;
        pass = Some(p);
        let Ok(mut line) = next else { return };
        let dropped = DROPPED.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            line.fields.push(("log_lines_dropped", dropped.to_string()));
        }
        let _ = emit_with_gil(py, &line);
    })
}

/// `logging.getLogger("ticklease").log(level, "message k=v …", extra={k: v})`;
/// a field named like a `LogRecord` attribute goes in as `ticklease_<name>`.
fn emit_with_gil(py: Python<'_>, line: &Line) -> PyResult<()> {
    const RESERVED: &[&str] = &[
        "name",
        "msg",
        "args",
        "levelname",
        "levelno",
        "pathname",
        "filename",
        "module",
        "exc_info",
        "exc_text",
        "stack_info",
        "lineno",
        "funcName",
        "created",
        "msecs",
        "relativeCreated",
        "thread",
        "threadName",
        "processName",
        "process",
        "message",
        "asctime",
        "taskName",
    ];
    let logger = py.import("logging")?.call_method1("getLogger", ("ticklease",))?;
    let extra = PyDict::new(py);
    let mut text = line.message.clone();
    for (name, value) in &line.fields {
        let _ = write!(text, " {name}={value}");
        let key = if RESERVED.contains(name) {
            format!("ticklease_{name}")
        } else {
            (*name).to_owned()
        };
        extra.set_item(key, value)?;
    }
    let kwargs = PyDict::new(py);
    kwargs.set_item("extra", extra)?;
    // No arguments: `logging` leaves a `%` in the text as it is.
    logger.call_method("log", (line.level, text), Some(&kwargs))?;
    Ok(())
}
