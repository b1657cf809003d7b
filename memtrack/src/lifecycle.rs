//! The stages every recording goes through, one set of names for the tracker, the allocator
//! recorder and sessions, and the one check of a transition:
//!
//! ```text
//! Idle ─claim─▶ Starting ─started─▶ Recording ─stop─▶ Stopping ─finish─▶ Idle
//!                  │                  pause ▼ ▲ resume      ▲
//!                  │                      Paused ──stop─────┘
//!                  └──────────────── abandon (the start failed) ────────────▶ Idle
//! ```
//! Paused is the stage of a recording that accumulates the calls of a `#[memtrack]` function
//! between two calls: nothing is recorded, the artifact stays open for the next call.
//! A transition from any other stage is refused with [`WrongStage`], which names both; it
//! changes nothing.

use std::fmt;

/// Where a recorder's one recording is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// No recording: a start may claim it.
    Idle,
    /// A start claimed it and is setting up; nothing is recorded yet.
    Starting,
    /// Recording.
    Recording,
    /// Between two calls of a recording that accumulates calls: switched off, the artifact
    /// open for the next call.
    Paused,
    /// Switched off; what was recorded is being drained. A new start is still refused, so that
    /// it cannot take this recording's events.
    Stopping,
}

impl Stage {
    /// The stage's name in messages: `idle`, `starting`, `recording`, `paused`, `stopping`.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Idle => "idle",
            Stage::Starting => "starting",
            Stage::Recording => "recording",
            Stage::Paused => "paused",
            Stage::Stopping => "stopping",
        }
    }

    /// `transition` from one of the stages `from` to `to`, or refused (and nothing changed).
    pub(crate) fn step(
        &mut self,
        transition: &'static str,
        from: &[Stage],
        to: Stage,
    ) -> Result<(), WrongStage> {
        if !from.contains(self) {
            return Err(WrongStage {
                transition,
                stage: *self,
            });
        }
        *self = to;
        Ok(())
    }
}

/// A transition asked for in a stage it does not start from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WrongStage {
    /// The transition.
    pub transition: &'static str,
    /// The stage it met.
    pub stage: Stage,
}

impl fmt::Display for WrongStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} while {}", self.transition, self.stage.name())
    }
}

impl std::error::Error for WrongStage {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_moves_from_its_stages_only_and_a_refusal_changes_nothing() {
        let mut s = Stage::Idle;
        s.step("claim", &[Stage::Idle], Stage::Starting).unwrap();
        assert_eq!(s, Stage::Starting);
        let refused = s
            .step("stop", &[Stage::Recording], Stage::Stopping)
            .unwrap_err();
        assert_eq!(refused.to_string(), "stop while starting");
        assert_eq!(s, Stage::Starting);
        s.step("abandon", &[Stage::Starting, Stage::Stopping], Stage::Idle)
            .unwrap();
        assert_eq!(s, Stage::Idle);
    }
}
