//! Progress bars on stderr for commands that read large artifacts.

use std::io::IsTerminal;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use memtrack::artifact::Reader;

/// Below this many events an artifact is read in well under a second (decoding and totalling
/// run at over ten million events a second): no bar.
const MIN_EVENTS: u64 = 1_000_000;

/// A bar counting the events of `reader` as they are decoded, labelled `what` (e.g.
/// "reading"); hidden when stderr is not a terminal (CI logs, pipes) or the artifact is small.
/// Call `finish_and_clear` when done so that the bar does not stay on screen.
pub fn events_bar(reader: &Reader, what: &str) -> ProgressBar {
    let n = reader.event_count();
    if n < MIN_EVENTS || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::with_draw_target(Some(n), ProgressDrawTarget::stderr());
    // The template is a constant: it parses or the program is wrong.
    let style =
        ProgressStyle::with_template("{msg} [{bar:30}] {human_pos}/{human_len} events, eta {eta}")
            .expect("valid progress template")
            .progress_chars("=> ");
    bar.set_style(style);
    let name = reader
        .path()
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    bar.set_message(format!("{what} {name}"));
    bar
}
