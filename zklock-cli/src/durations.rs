//! How the lock tables (`ls`, `status`, `top`) show ages and durations: short, in the largest
//! unit that still says enough.

use std::time::Duration;

use zklock_core::Contender;

/// How long `c` has held or waited, in whole seconds, minutes or hours (`42s`, `3m`, `5h`).
pub(crate) fn age(c: &Contender) -> String {
    let secs = c.age().as_secs();
    match secs {
        0..=119 => format!("{secs}s"),
        120..=7199 => format!("{}m", secs / 60),
        _ => format!("{}h", secs / 3600),
    }
}

/// A duration for `top`: tenths of a second below 10 s (`2.5s`), then whole seconds, minutes or
/// hours; `-` for none.
pub(crate) fn short(d: Option<Duration>) -> String {
    let Some(d) = d else { return "-".into() };
    let ms = d.as_millis();
    match ms {
        0..=9_999 => format!("{:.1}s", d.as_secs_f64()),
        10_000..=119_999 => format!("{}s", ms / 1000),
        120_000..=7_199_999 => format!("{}m", ms / 60_000),
        _ => format!("{}h", ms / 3_600_000),
    }
}
