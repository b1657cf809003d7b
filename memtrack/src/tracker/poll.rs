//! The poller thread: drains the ring buffer into the encoder.

use std::cell::RefCell;
use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use libbpf_rs::{MapHandle, RingBufferBuilder};
use memtrack_bpf::{RawEvent, kind};

use super::TrackerError;
use super::bpf::{exclude_tid, gettid};
use crate::encode::Encoder;
use crate::event::{Event, EventKind};

/// How often the poller drains when no wakeup comes: events are submitted without wakeups
/// (a wakeup per event costs ~1.3 µs here), so `poll()` alone would wait for the 64 KiB
/// watermark.
const DRAIN_PERIOD: Duration = Duration::from_millis(10);

/// The [`Event`] a ring-buffer record stands for; `None` for a kind this build does not know.
pub(crate) fn to_event(r: &RawEvent) -> Option<Event> {
    let k = match r.kind {
        kind::MALLOC => EventKind::Malloc {
            addr: r.addr,
            size: r.size,
        },
        kind::CALLOC => EventKind::Calloc {
            addr: r.addr,
            size: r.size,
        },
        kind::REALLOC => EventKind::Realloc {
            old_addr: r.old_addr,
            new_addr: r.addr,
            size: r.size,
        },
        kind::ALIGNED_ALLOC => EventKind::AlignedAlloc {
            addr: r.addr,
            size: r.size,
            align: r.align,
        },
        kind::FREE => EventKind::Free { addr: r.addr },
        kind::MMAP => EventKind::Mmap {
            addr: r.addr,
            size: r.size,
        },
        kind::MUNMAP => EventKind::Munmap {
            addr: r.addr,
            size: r.size,
        },
        kind::MREMAP => EventKind::Mremap {
            old_addr: r.old_addr,
            new_addr: r.addr,
            size: r.size,
        },
        kind::BRK => EventKind::Brk { addr: r.addr },
        _ => return None,
    };
    Some(Event::new(r.ts, r.pid, r.tid, k))
}

/// What the poller hands back when it stops.
pub(crate) struct Drained<W: Write + Send + 'static> {
    pub(crate) encoder: Encoder<W>,
    /// The first error of `Encoder::push`, if any (later events were dropped).
    pub(crate) push_error: Option<crate::Error>,
    /// Records of an unknown kind or size (a mismatched object).
    pub(crate) malformed: u64,
}

/// A running poller thread.
pub(crate) struct Poller<W: Write + Send + 'static> {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Result<Drained<W>, TrackerError>>,
}

impl<W: Write + Send + 'static> Poller<W> {
    /// Starts draining `events` into `encoder`. With `exclude` the thread first adds its own
    /// tid to the excluded set (in-process recording); returns once that is done.
    pub(crate) fn spawn(
        events: Arc<MapHandle>,
        exclude: Option<Arc<MapHandle>>,
        encoder: Encoder<W>,
    ) -> Result<Self, TrackerError> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::sync_channel(1);
        let stop2 = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("memtrack-poll".into())
            .spawn(move || {
                if let Some(ex) = &exclude {
                    if let Err(e) = exclude_tid(ex, gettid()) {
                        let _ = ready_tx.send(Err(e));
                        return Err(TrackerError::InvalidOption("poller failed to start".into()));
                    }
                }
                let _ = ready_tx.send(Ok(()));
                run(&events, encoder, &stop2)
            })
            .map_err(|source| TrackerError::Io {
                what: "spawning the poller".into(),
                source,
            })?;
        match ready_rx.recv() {
            Ok(Ok(())) => Ok(Self { stop, thread }),
            Ok(Err(e)) => {
                let _ = thread.join();
                Err(e)
            }
            Err(_) => Err(match thread.join() {
                Ok(Err(e)) => e,
                _ => TrackerError::InvalidOption("the poller thread died".into()),
            }),
        }
    }

    /// Asks the thread to drain the tail (call after disabling recording) and waits for it.
    pub(crate) fn finish(self) -> Result<Drained<W>, TrackerError> {
        self.stop.store(true, Ordering::Release);
        self.thread.join().unwrap_or_else(|_| {
            Err(TrackerError::InvalidOption(
                "the poller thread panicked".into(),
            ))
        })
    }
}

fn run<W: Write + Send + 'static>(
    events: &MapHandle,
    encoder: Encoder<W>,
    stop: &AtomicBool,
) -> Result<Drained<W>, TrackerError> {
    let state = RefCell::new(Drained {
        encoder,
        push_error: None,
        malformed: 0,
    });
    {
        let mut builder = RingBufferBuilder::new();
        builder
            .add(events, |data: &[u8]| {
                let mut st = state.borrow_mut();
                match RawEvent::from_bytes(data).as_ref().and_then(to_event) {
                    Some(ev) if st.push_error.is_none() => {
                        if let Err(e) = st.encoder.push(ev) {
                            st.push_error = Some(e);
                        }
                    }
                    Some(_) => {}
                    None => st.malformed += 1,
                }
                0
            })
            .map_err(|e| TrackerError::bpf("adding the ring buffer", e))?;
        let rb = builder
            .build()
            .map_err(|e| TrackerError::bpf("mapping the ring buffer", e))?;
        let drain = || -> Result<(), TrackerError> {
            rb.consume()
                .map_err(|e| TrackerError::bpf("draining the ring buffer", e))
        };
        while !stop.load(Ordering::Acquire) {
            // Returns early on a forced wakeup (watermark passed), else after the period.
            rb.poll(DRAIN_PERIOD)
                .map_err(|e| TrackerError::bpf("polling the ring buffer", e))?;
            drain()?;
        }
        // The tail: recording is off, but a program that passed the switch just before may
        // still be filling its record; drain until two passes 1 ms apart find nothing.
        loop {
            drain()?;
            std::thread::sleep(Duration::from_millis(1));
            if rb.consume_raw() <= 0 {
                break;
            }
        }
    }
    Ok(state.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_events_convert_field_by_field() {
        let raw = RawEvent {
            ts: 5,
            pid: 7,
            tid: 8,
            kind: kind::REALLOC,
            reserved: 0,
            addr: 0x2000,
            old_addr: 0x1000,
            size: 96,
            align: 0,
        };
        let ev = to_event(&raw).unwrap();
        assert_eq!(
            ev,
            Event::new(
                5,
                7,
                8,
                EventKind::Realloc {
                    old_addr: 0x1000,
                    new_addr: 0x2000,
                    size: 96
                }
            )
        );
        let aligned = RawEvent {
            kind: kind::ALIGNED_ALLOC,
            align: 64,
            ..raw
        };
        assert_eq!(
            to_event(&aligned).unwrap().kind,
            EventKind::AlignedAlloc {
                addr: 0x2000,
                size: 96,
                align: 64
            }
        );
        assert!(to_event(&RawEvent { kind: 0, ..raw }).is_none());
        assert!(to_event(&RawEvent { kind: 10, ..raw }).is_none());
        for k in 1..=9u32 {
            let ev = to_event(&RawEvent { kind: k, ..raw }).unwrap();
            assert_eq!(
                ev.kind.tag() as u32,
                k,
                "tag numbers of memtrack.h and KindTag differ"
            );
        }
    }
}
