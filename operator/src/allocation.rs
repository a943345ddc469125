//! Cilium's watermark arithmetic: how many addresses a node needs, and how many it holds in
//! excess. Pure functions so both of §7's tables are unit tests.
//!
//! All counts are signed because Cilium's spec fields are (a `pre-allocate` of `-1` is used
//! by its own tests to mean "less than nothing"); the results are never negative.

/// Addresses to allocate so that `pre` stay free, at least `min` are held, and at most
/// `max` are held (`min`/`max` of 0 mean unset).
pub fn needed_ips(available: i64, used: i64, pre: i64, min: i64, max: i64) -> usize {
    let mut needed = pre - (available - used);
    if min > 0 {
        needed = needed.max(min - available);
    }
    // Only what still fits under the cap: the cap wins over pre- and min-allocate.
    if max > 0 && available + needed > max {
        needed = max - available;
    }
    usize::try_from(needed).unwrap_or(0)
}

/// Free addresses beyond `pre + max_above_watermark` that may be released. Nothing is excess
/// while both usage and holdings are still within the initial `min + max_above_watermark`
/// allocation, so addresses allocated at bootstrap are not released straight away.
pub fn excess_ips(
    available: i64,
    used: i64,
    pre: i64,
    min: i64,
    max_above_watermark: i64,
) -> usize {
    let initial = min + max_above_watermark;
    if used <= initial && available <= initial {
        return 0;
    }
    usize::try_from(available - used - pre - max_above_watermark).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn needed_matches_ciliums_table() {
        // (available, used, pre, min, max → needed), §7.
        let table = [
            (0, 0, 0, 16, 0, 16),
            (0, 0, 8, 16, 0, 16),
            (0, 0, 16, 8, 0, 16),
            (0, 0, 16, 0, 0, 16),
            (8, 0, 0, 16, 0, 8),
            (8, 4, 8, 0, 0, 4),
            (8, 4, 8, 8, 0, 4),
            (8, 4, 8, 8, 6, 0),
            (8, 4, 8, 0, 8, 0),
            (4, 4, 8, 0, 8, 4),
        ];
        for (available, used, pre, min, max, expected) in table {
            assert_eq!(
                needed_ips(available, used, pre, min, max),
                expected,
                "needed_ips({available}, {used}, {pre}, {min}, {max})"
            );
        }
    }

    #[test]
    fn excess_matches_ciliums_table() {
        // (available, used, pre, min, max-above-watermark → excess), §7.
        let table = [
            (0, 0, 0, 16, 0, 0),
            (15, 0, 8, 16, 8, 0),
            (17, 0, 8, 16, 0, 9),
            (20, 0, 8, 16, 4, 0),
            (21, 0, 8, 0, 4, 9),
            (20, 0, 8, 20, 8, 0),
            (16, 1, 8, 16, 8, 0),
            (20, 4, 8, 17, 8, 0),
            (20, 4, 8, 0, 0, 8),
            (20, 4, 8, 0, 8, 0),
        ];
        for (available, used, pre, min, above, expected) in table {
            assert_eq!(
                excess_ips(available, used, pre, min, above),
                expected,
                "excess_ips({available}, {used}, {pre}, {min}, {above})"
            );
        }
    }

    #[test]
    fn negative_pre_allocate_never_yields_a_negative_need() {
        assert_eq!(needed_ips(10, 8, -1, 10, 0), 0);
        assert_eq!(needed_ips(10, 8, -1, 20, 0), 10);
    }
}
