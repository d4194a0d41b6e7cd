//! Calendar arithmetic shared by every date the binary prints (HTTP `Date`, log timestamps, CLI
//! output): days since the Unix epoch to a proleptic Gregorian (year, month, day), by Howard
//! Hinnant's `civil_from_days`. Pure; no clock, no allocation.

/// (year, month 1..=12, day 1..=31) of the day `days` after 1970-01-01 (negative: before).
pub fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

#[cfg(test)]
mod tests {
    use super::civil_from_days;

    #[test]
    fn known_days() {
        // Proves the epoch, a leap day, the turn of a century and a day before the epoch.
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
        assert_eq!(civil_from_days(10_957), (2000, 1, 1));
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(20_786), (2026, 11, 29));
    }
}
