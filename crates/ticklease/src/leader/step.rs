//! Steps: the guard that keeps one panicking step (or one panicking item of a
//! batch) from stopping the rest of a tick.
//!
//! A step that panics stops; the guard logs `step panicked; running the rest`
//! with the step's name, the panic's message and its backtrace, keeps the
//! first panic, and the remaining steps run. [`Steps::finish`] raises the
//! first panic again at the end of the tick, so `lead` releases the tick as
//! failed (`not_before = now + interval`) and counts it as `panicked`.

use std::any::Any;
use std::backtrace::Backtrace;
use std::cell::RefCell;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Once;

use futures::FutureExt;

use crate::leader::lead::Tick;
use crate::ops::outcome::panic_message;
use crate::term::role::Role;

thread_local! {
    /// The backtrace of the last panic on this thread, taken by the panic hook.
    static LAST_BACKTRACE: RefCell<Option<Backtrace>> = const { RefCell::new(None) };
}

/// Chains a hook that records each panic's backtrace for the guard to log.
/// The previous hook still runs.
fn install_backtrace_hook() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            LAST_BACKTRACE.with(|b| *b.borrow_mut() = Some(Backtrace::force_capture()));
            previous(info);
        }));
    });
}

/// The first panic a guard caught.
struct Caught {
    step: String,
    payload: Box<dyn Any + Send>,
}

/// The guard of one tick's steps. Make one per tick, run each step through
/// it, and end the work with [`Steps::finish`].
pub struct Steps {
    role: Role,
    first: Option<Caught>,
    panics: usize,
}

impl std::fmt::Debug for Steps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Steps")
            .field("role", &self.role)
            .field("first_panic", &self.first.as_ref().map(|c| &c.step))
            .field("panics", &self.panics)
            .finish()
    }
}

impl Steps {
    /// A guard for `tick`'s steps.
    pub fn new(tick: &Tick) -> Steps {
        install_backtrace_hook();
        Steps {
            role: tick.role().clone(),
            first: None,
            panics: 0,
        }
    }

    /// Runs one step; `None` if it panicked (the panic is kept for `finish`).
    pub async fn run<T>(&mut self, step: &str, work: impl Future<Output = T>) -> Option<T> {
        match AssertUnwindSafe(work).catch_unwind().await {
            Ok(value) => Some(value),
            Err(payload) => {
                self.caught(step.to_string(), payload);
                None
            }
        }
    }

    /// Runs `work` for each item under the same guard: an item that panics is
    /// logged and kept (the first panic wins), and the other items still run.
    /// Returns the number of items whose work panicked.
    pub async fn each<I, F, Fut>(&mut self, step: &str, items: I, mut work: F) -> usize
    where
        I: IntoIterator,
        I::Item: std::fmt::Debug,
        F: FnMut(I::Item) -> Fut,
        Fut: Future<Output = ()>,
    {
        let mut panicked = 0;
        for item in items {
            let name = format!("{step}[{item:?}]");
            if self.run(&name, work(item)).await.is_none() {
                panicked += 1;
            }
        }
        panicked
    }

    /// How many steps or items have panicked so far.
    pub fn panics(&self) -> usize {
        self.panics
    }

    /// Ends the tick's work: raises the first panic again, if any.
    pub fn finish(self) {
        if let Some(first) = self.first {
            tracing::error!(role = %self.role, step = %first.step, panics = self.panics,
                "raising the first step panic at the end of the tick");
            std::panic::resume_unwind(first.payload);
        }
    }

    fn caught(&mut self, step: String, payload: Box<dyn Any + Send>) {
        let backtrace = LAST_BACKTRACE.with(|b| b.borrow_mut().take());
        tracing::error!(
            role = %self.role,
            step = %step,
            panic = panic_message(&*payload),
            backtrace = %backtrace.map(|b| b.to_string()).unwrap_or_default(),
            "step panicked; running the rest"
        );
        self.panics += 1;
        if self.first.is_none() {
            self.first = Some(Caught { step, payload });
        }
    }
}
