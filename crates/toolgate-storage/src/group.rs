//! Leader/follower group commit, generic over the job and the answer: one implementation for the
//! audit log and the effect journal.
//!
//! Callers queue their job. The first caller that finds no leader becomes the leader: it takes every
//! queued job (its own included) and runs the store's batch function on them, which answers each
//! caller exactly once. While a batch runs, new callers queue; when the leader hands off (at the
//! latest when its batch function returns), the first of them becomes the next leader and takes
//! the queue. A batch function may hand off early ([`Handoff::hand_off`]) to pipeline: the effect
//! journal decides and writes a batch, hands off, and only then waits for the `fdatasync` its
//! answers need, while the next batch is decided and written.
//!
//! Each caller waits on its own condition variable, so a batch wakes only its own callers. If a
//! batch function panics, every caller it did not answer gets the group's `abandoned` answer and
//! the lead passes on: later calls never hang behind a dead leader.

use std::fmt;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

/// A group commit of jobs `J` answered with `A`.
pub struct GroupCommit<J, A> {
    queue: Mutex<Queue<J, A>>,
    abandoned: fn() -> A,
}

impl<J, A> fmt::Debug for GroupCommit<J, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let queue = self.lock();
        f.debug_struct("GroupCommit")
            .field("queued", &queue.pending.len())
            .field("leading", &queue.leading)
            .finish()
    }
}

struct Queue<J, A> {
    pending: Vec<(J, Arc<Waiter<A>>)>,
    /// A leader is running a batch (or was just handed the lead).
    leading: bool,
}

/// One waiting caller, woken exactly once: with its answer, or to lead the next batch.
struct Waiter<A> {
    slot: Mutex<Option<Wake<A>>>,
    cond: Condvar,
}

enum Wake<A> {
    Lead,
    Answer(A),
}

impl<A> Waiter<A> {
    fn new() -> Self {
        Waiter {
            slot: Mutex::new(None),
            cond: Condvar::new(),
        }
    }

    fn wake(&self, wake: Wake<A>) {
        // The slot is written once per wake-up; a poisoned lock still holds a valid Option.
        *self.slot.lock().unwrap_or_else(PoisonError::into_inner) = Some(wake);
        self.cond.notify_one();
    }

    fn wait(&self) -> Wake<A> {
        let mut slot = self.slot.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(wake) = slot.take() {
                return wake;
            }
            slot = self.cond.wait(slot).unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// A queued caller, handed to the batch function with its job: answer it once. Dropped without an
/// answer (the batch function panicked), it answers the group's `abandoned` value.
pub struct Caller<A> {
    waiter: Option<Arc<Waiter<A>>>,
    abandoned: fn() -> A,
}

impl<A> fmt::Debug for Caller<A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Caller")
            .field("answered", &self.waiter.is_none())
            .finish()
    }
}

impl<A> Caller<A> {
    /// Gives this caller its answer (and wakes it, unless it is the leader itself).
    pub fn answer(mut self, answer: A) {
        if let Some(waiter) = self.waiter.take() {
            waiter.wake(Wake::Answer(answer));
        }
    }
}

impl<A> Drop for Caller<A> {
    fn drop(&mut self) {
        if let Some(waiter) = self.waiter.take() {
            waiter.wake(Wake::Answer((self.abandoned)()));
        }
    }
}

/// The leader's right to pass the lead on; passed on when dropped at the latest.
pub struct Handoff<'g, J, A> {
    group: &'g GroupCommit<J, A>,
    done: bool,
}

impl<J, A> fmt::Debug for Handoff<'_, J, A> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Handoff").field("done", &self.done).finish()
    }
}

impl<J, A> Handoff<'_, J, A> {
    /// Lets the next batch start now: the first caller that queued meanwhile becomes its leader
    /// (or, with none, the next caller to come). Later calls do nothing.
    pub fn hand_off(&mut self) {
        if self.done {
            return;
        }
        self.done = true;
        let mut queue = self.group.lock();
        match queue.pending.first() {
            Some((_, next)) => next.wake(Wake::Lead),
            None => queue.leading = false,
        }
    }
}

impl<J, A> Drop for Handoff<'_, J, A> {
    fn drop(&mut self) {
        self.hand_off();
    }
}

impl<J, A> GroupCommit<J, A> {
    /// An empty group; `abandoned` answers the callers of a batch whose function panicked.
    pub fn new(abandoned: fn() -> A) -> Self {
        GroupCommit {
            queue: Mutex::new(Queue {
                pending: Vec::new(),
                leading: false,
            }),
            abandoned,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue<J, A>> {
        // The queue is a list and a flag, consistent between statements even if a holder panicked.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many jobs are queued for the next batch right now.
    pub fn queued(&self) -> usize {
        self.lock().pending.len()
    }

    /// Runs `job` in a batch and returns its answer. If this caller leads, `batch` runs on every
    /// queued job (this one included), must answer each [`Caller`], and may hand off early.
    pub fn submit(
        &self,
        job: J,
        batch: impl FnOnce(Vec<(J, Caller<A>)>, &mut Handoff<'_, J, A>),
    ) -> A {
        let me = Arc::new(Waiter::new());
        let mut queue = self.lock();
        queue.pending.push((job, Arc::clone(&me)));
        if queue.leading {
            drop(queue);
            match me.wait() {
                Wake::Answer(answer) => return answer,
                Wake::Lead => queue = self.lock(),
            }
        } else {
            queue.leading = true;
        }
        let jobs: Vec<(J, Caller<A>)> = std::mem::take(&mut queue.pending)
            .into_iter()
            .map(|(job, waiter)| {
                (
                    job,
                    Caller {
                        waiter: Some(waiter),
                        abandoned: self.abandoned,
                    },
                )
            })
            .collect();
        drop(queue);
        let mut handoff = Handoff {
            group: self,
            done: false,
        };
        batch(jobs, &mut handoff);
        drop(handoff);
        // Every caller of the batch, this one included, was answered (or dropped: abandoned).
        match me.wait() {
            Wake::Answer(answer) => answer,
            Wake::Lead => unreachable!("a leader is not queued, so it is never handed the lead"),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::sync::Barrier;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::thread;

    #[test]
    fn every_caller_gets_its_own_answer_and_batches_form() {
        let group = Arc::new(GroupCommit::<u64, Result<u64, String>>::new(|| {
            Err("abandoned".to_owned())
        }));
        let batches = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(16));
        let handles: Vec<_> = (0..16u64)
            .map(|i| {
                let (group, batches, barrier) = (
                    Arc::clone(&group),
                    Arc::clone(&batches),
                    Arc::clone(&barrier),
                );
                thread::spawn(move || {
                    barrier.wait();
                    (0..50u64)
                        .map(|j| {
                            let job = i * 1000 + j;
                            let answer = group.submit(job, |jobs, _| {
                                batches.fetch_add(1, Ordering::Relaxed);
                                // Slow enough that others queue meanwhile.
                                thread::sleep(std::time::Duration::from_micros(200));
                                for (job, caller) in jobs {
                                    caller.answer(Ok(job * 2));
                                }
                            });
                            assert_eq!(answer, Ok(job * 2));
                        })
                        .count()
                })
            })
            .collect();
        let calls: usize = handles.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(calls, 800);
        assert!(
            batches.load(Ordering::Relaxed) < 800,
            "no batch held two jobs"
        );
        assert_eq!(group.queued(), 0);
    }

    #[test]
    fn a_panicking_batch_abandons_its_callers_and_the_lead_passes_on() {
        let group = Arc::new(GroupCommit::<u64, Result<u64, String>>::new(|| {
            Err("abandoned".to_owned())
        }));
        let leader = {
            let group = Arc::clone(&group);
            thread::spawn(move || {
                let _ = group.submit(1, |_jobs, _| panic!("a bug in the batch function"));
            })
        };
        assert!(leader.join().is_err(), "the leader's panic propagates");
        // The group still works: no leader flag left behind.
        let answer = group.submit(2, |jobs, _| {
            for (job, caller) in jobs {
                caller.answer(Ok(job));
            }
        });
        assert_eq!(answer, Ok(2));
        // Two callers queued behind a batch form the next one; its leader's function panics:
        // the leader's panic propagates, the other caller is answered `abandoned`.
        let leading = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let first = {
            let (group, leading) = (Arc::clone(&group), Arc::clone(&leading));
            thread::spawn(move || {
                group.submit(10, |jobs, _| {
                    leading.store(true, Ordering::SeqCst);
                    while group.queued() < 2 {
                        thread::yield_now();
                    }
                    for (job, caller) in jobs {
                        caller.answer(Ok(job));
                    }
                })
            })
        };
        while !leading.load(Ordering::SeqCst) {
            thread::yield_now();
        }
        let followers: Vec<_> = (11..13u64)
            .map(|job| {
                let group = Arc::clone(&group);
                thread::spawn(move || {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        group.submit(job, |_jobs, _| panic!("a bug in the batch function"))
                    }))
                })
            })
            .collect();
        assert_eq!(first.join().unwrap(), Ok(10));
        let outcomes: Vec<_> = followers.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(
            outcomes.iter().filter(|o| o.is_err()).count(),
            1,
            "one leader panicked"
        );
        assert!(
            outcomes
                .iter()
                .any(|o| matches!(o, Ok(Err(why)) if why == "abandoned")),
            "the other was abandoned"
        );
    }
}
