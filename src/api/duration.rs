//! Durations in the spec are strings such as `500ms`, `30s`, `2m` or `1h`: one integer and one unit,
//! the subset of Go's `time.ParseDuration` that a reader of the YAML can check at a glance. The schema
//! carries [`DURATION_PATTERN`]; [`parse_duration`] turns a value into a [`Duration`].
use std::time::Duration;

/// The schema pattern every duration field carries.
pub const DURATION_PATTERN: &str = r"^\d+(ms|s|m|h)$";

/// What to write instead of a value that is not a duration.
const HINT: &str = "write an integer and one unit (ms, s, m or h), e.g. \"500ms\", \"30s\", \"2m\"";

/// A spec duration that does not parse; the message says what to write instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error("{0:?} is not a duration: {HINT}")]
    NotADuration(String),
    #[error("{0:?} is too large: {HINT}")]
    TooLarge(String),
}

/// Parses `<integer><unit>` with unit `ms`, `s`, `m` or `h`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (digits, unit) = text.split_at(split);
    let not_a_duration = || DurationError::NotADuration(text.to_string());
    let too_large = || DurationError::TooLarge(text.to_string());
    if digits.is_empty() {
        return Err(not_a_duration());
    }
    let n: u64 = digits.parse().map_err(|_| too_large())?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        _ => return Err(not_a_duration()),
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(too_large)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert_eq!(parse_duration("0s"), Ok(Duration::ZERO));
    }

    #[test]
    fn refuses_what_go_would_write_differently() {
        for bad in [
            "",
            "s",
            "30",
            "1.5s",
            "1m30s",
            "-1s",
            "30 s",
            "30sec",
            "99999999999999999999h",
        ] {
            assert!(parse_duration(bad).is_err(), "{bad:?} parsed");
        }
    }
}
